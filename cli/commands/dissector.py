"""``embnic dissector``: write the Wireshark Lua plug-in generated from the protocol's field table."""
from __future__ import annotations

import click

from embnic.client_lib import consts
from embnic.control import wireshark as lib
from embnic.cli.commands.options import OutPath


@click.command()
@click.option("--out", "-o", default="-", show_default=True, metavar="FILE",
              type=OutPath("file", "embnic.lua", allow_dash=True),
              help="Where to write the plug-in ('-': standard output); its folder must exist.")
def dissector(out):
    """Write the Wireshark dissector of the embnic protocol: a Lua plug-in generated from the
    one field table (client_lib/consts.py), the same as the shipped contrib/wireshark/embnic.lua.
    Registered on UDP port 7878 ("Decode As" for any other). Install it in your personal plug-ins
    folder, ~/.local/lib/wireshark/plugins/, or load it for one run with tshark -X lua_script:FILE.

    \b
    Examples:
      embnic dissector --out ~/.local/lib/wireshark/plugins/embnic.lua
      embnic dissector --out embnic.lua && tshark -X lua_script:embnic.lua -2 -r t.pcap -Y embnic
      tshark -X lua_script:embnic.lua -d udp.port==9000,embnic -r other-port.pcap
    """
    if out == "-":
        click.echo(lib.generate_lua(), nl=False)
        return
    n = lib.write_lua(out)
    click.echo(f"wrote {out} ({n} bytes): Wireshark dissector for embnic protocol v{consts.VERSION}, "
               f"UDP port {consts.UDP_PORT}", err=True)

"""``embnic inspect BINARY``: the build info in embnic-dp's ELF section, and whether it matches."""
from __future__ import annotations

import json

import click

from embnic.client_lib import consts
from embnic.control import buildinfo
from embnic.control.errors import OperationalError
from embnic.cli.commands.options import json_option


@click.command()
@click.argument("binary", required=False, metavar="[BINARY]")
@json_option
@click.option("--check", is_flag=True, help="Exit 1 if the binary does not match the client library.")
def inspect(binary, as_json, check):
    """Show the build info of BINARY (default: $EMBNIC_DP, else dataplane/build/embnic-dp),
    read from its ELF section .embnic_buildinfo: protocol version, header length and field
    layout, UDP port, table sizes, git revision, DPDK version, and whether it matches this
    client library (which `pipeline load` requires).

    \b
    Examples:
      embnic inspect dataplane/build/embnic-dp
      embnic inspect --json --check dataplane/build/embnic-dp
    """
    if binary is None:
        from embnic.control.targets.dpdk.target import find_binary

        binary = str(find_binary(None))
    bi = buildinfo.read(binary)
    diffs = buildinfo.check(bi)
    if as_json:
        click.echo(json.dumps({**bi.as_dict(), "compatible": not diffs, "mismatches": diffs,
                               "client_lib": {"proto_version": consts.VERSION, "hdr_len": consts.HDR_LEN,
                                              "udp_port": consts.UDP_PORT}}, indent=2))
    else:
        fields = " ".join(f"{n}@{o}/{s}" for n, o, s in bi.fields)
        rows = [
            ("binary", binary),
            ("build info", f"v{bi.info_version} (ELF section {buildinfo.SECTION})"),
            ("protocol", f"v{bi.proto_version}, header {bi.hdr_len} bytes, UDP port {bi.udp_port}"),
            ("table sizes", f"ring {bi.ring_size}, routes {bi.route_table_size}, clients {bi.client_table_size}, "
                            f"state {bi.state_table_size}"),
            ("git revision", bi.git_rev),
            ("DPDK", bi.dpdk_version),
            ("header fields", f"{len(bi.fields)}: {fields}"),
            ("compatible", "yes (client library protocol v%d, header %d bytes)" % (consts.VERSION, consts.HDR_LEN)
             if not diffs else "NO: " + "; ".join(diffs)),
        ]
        for k, v in rows:
            click.echo(f"{k + ':':<15}{v}")
    if check and diffs:
        raise OperationalError(f"{binary} does not match the client library ({'; '.join(diffs)}): "
                               "rebuild it with `make -C dataplane`")

"""``embnic inspect [BINARY]``: the build info in embnic-dp's ELF section and whether it matches, and the
package's own C libraries (the client's round, the shard's path): built, loaded, from which sources."""
from __future__ import annotations

import json

import click

from embnic.client_lib import clib, consts
from embnic.control import buildinfo
from embnic.control.errors import OperationalError
from embnic.cli.commands.options import json_option


@click.command()
@click.argument("binary", required=False, metavar="[BINARY]")
@json_option
@click.option("--check", is_flag=True, help="Exit 1 if the binary does not match the client library.")
def inspect(binary, as_json, check):
    """Show the build info of BINARY (default: $EMBNIC_DP, else dataplane/build/embnic-dp), read
    from its ELF section .embnic_buildinfo, and whether it matches this client library (which
    `pipeline load` requires); then the package's C libraries (the client's round, the shard's
    path) and whether they load. With no BINARY and no embnic-dp built, only the libraries.

    \b
    Examples:
      embnic inspect dataplane/build/embnic-dp
      embnic inspect --json --check dataplane/build/embnic-dp
    """
    libs = clib.status(consts.VERSION)
    if binary is None:
        from embnic.control.targets.dpdk.target import find_binary

        try:
            binary = str(find_binary(None))
        except OperationalError as e:  # no card on this host: the libraries still say what runs here
            if isinstance(e, buildinfo.BinaryArgumentError):  # $EMBNIC_DP names no file: the user's to fix
                raise
            _show_libraries(libs, as_json, card=str(e))
            return
    bi = buildinfo.read(binary)
    diffs = buildinfo.check(bi)
    if as_json:
        click.echo(json.dumps({**bi.as_dict(), "compatible": not diffs, "mismatches": diffs,
                               "client_lib": {"proto_version": consts.VERSION, "hdr_len": consts.HDR_LEN,
                                              "udp_port": consts.UDP_PORT},
                               "libraries": libs}, indent=2))
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
        _show_libraries(libs, False)
    if check and diffs:
        raise OperationalError(f"{binary} does not match the client library ({'; '.join(diffs)}): "
                               "rebuild it with `make -C dataplane`")


def _show_libraries(libs: list[dict], as_json: bool, card: str | None = None) -> None:
    """Print the package's C libraries (``clib.status``): one row each, ``card`` (why no card binary was
    read) first when given."""
    if as_json:
        click.echo(json.dumps({"card": card, "libraries": libs}, indent=2))
        return
    if card:
        click.echo(f"{'binary:':<15}none ({card})")
    for lib in libs:
        state = f"{lib['path']} ({lib['detail']})" if lib["ok"] else f"NOT LOADED: {lib['detail']}"
        click.echo(f"{lib['name'] + ' lib:':<15}{state}")

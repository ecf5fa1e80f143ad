"""Build small ELF programs carrying a ``.embnic_buildinfo`` section, for build-info tests.

``build_fake_dp(out, proto_version=1)`` compiles (gcc) a program whose section holds the given
values and whose ``main`` execs ``python3 ctl_fake_card.py ARGS`` — a stand-in embnic-dp that
``pipeline load`` can start, check and stop without DPDK.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from embnic.client_lib import consts

HERE = Path(__file__).resolve().parent
DP_INCLUDE = HERE.parents[1] / "dataplane" / "include"


def c_layout(decls: str, exprs: list[str], out_dir: Path) -> list[int]:
    """Compile and run a C program that includes ``dataplane/include/embnic_buildinfo.h`` (the
    card's header; it needs no DPDK) after ``decls`` and prints each of ``exprs`` (e.g.
    ``sizeof(struct embnic_buildinfo)``) as an unsigned number: what the C compiler says, not
    what the Python reader assumes."""
    src = out_dir / "layout.c"
    body = "".join(f'    printf("%zu\\n", (size_t)({e}));\n' for e in exprs)
    src.write_text(f"#include <stddef.h>\n#include <stdio.h>\n{decls}\n#include \"embnic_buildinfo.h\"\n"
                   f"int main(void)\n{{\n{body}    return 0;\n}}\n")
    exe = out_dir / "layout"
    subprocess.run(["gcc", "-O0", "-I", str(DP_INCLUDE), "-o", str(exe), str(src)], check=True, capture_output=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]

_C = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "embnic_buildinfo.h"   /* the card's own layout (dataplane/include), not a copy */

__attribute__((section(".embnic_buildinfo"), used))
const struct embnic_buildinfo embnic_buildinfo = {
    .magic = MAGIC_STR, .info_version = 1, .proto_version = PROTO, .hdr_len = HDRLEN, .udp_port = UDPPORT,
    .ring_size = 4096, .route_table_size = 1024, .client_table_size = 1024, .state_table_size = 65536,
    .n_fields = NFIELDS, .fields = { FIELDS }, .git_rev = "0123456789abcdef0123456789abcdef01234567",
    .dpdk_version = "DPDK 22.11.fake",
};

int main(int argc, char **argv)
{
    char **a = calloc(argc + 3, sizeof(*a));
    a[0] = PYTHON;
    a[1] = SCRIPT;
    for (int i = 1; i < argc; i++)
        a[i + 1] = argv[i];
    execv(PYTHON, a);
    perror("execv");
    return 127;
}
"""


def have_cc() -> bool:
    return shutil.which("gcc") is not None


def build_fake_dp(out: Path, proto_version: int = consts.VERSION, hdr_len: int = consts.HDR_LEN,
                  udp_port: int = consts.UDP_PORT, fields=consts.HEADER_FIELDS, magic: str = "EMBNICBI") -> Path:
    """Compile the stand-in embnic-dp to ``out`` and return it."""
    fl = ", ".join(f'{{ "{n}", {o}, {s} }}' for n, o, s in fields)
    src = out.with_suffix(".c")
    src.write_text(_C)
    defs = {"MAGIC_STR": f'"{magic}"', "PROTO": str(proto_version), "HDRLEN": str(hdr_len),
            "UDPPORT": str(udp_port), "NFIELDS": str(len(fields)), "FIELDS": fl,
            "PYTHON": f'"{sys.executable}"', "SCRIPT": f'"{HERE / "ctl_fake_card.py"}"'}
    cmd = ["gcc", "-O0", "-I", str(DP_INCLUDE), "-o", str(out), str(src)] + [f"-D{k}={v}" for k, v in defs.items()]
    subprocess.run(cmd, check=True, capture_output=True)
    return out

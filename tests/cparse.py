"""The card's parser (dataplane/parse.c) as a shared library for tests that compare a Python reading
of frames with the card's verdict (tests/dataplane/test_header_rules.py, tests/control/test_wireshark.py).
Not a test file; tests/conftest.py puts this folder on ``sys.path``.
"""
from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path
from typing import Callable

import pytest

from embnic.client_lib import consts

DP = Path(__file__).resolve().parents[1] / "dataplane"


def parse_verdict(out_dir: Path) -> Callable[[bytes, int], str | None]:
    """Build parse.c into ``out_dir/libparse.so`` (gcc, DPDK's headers) and return
    ``verdict(frame, csum_ok) -> None | drop reason name``: ``embnic_parse`` on a whole Ethernet
    frame (``csum_ok`` 1: the IPv4 checksum is taken as checked, 0: parse.c checks it; any
    destination address). Fails the test (not a skip) where gcc or libdpdk-dev is missing:
    `make deps` installs both."""
    cc = shutil.which("gcc")
    if cc is None:
        pytest.fail("gcc absent: run `make deps` (build-essential)")
    flags = subprocess.run(["pkg-config", "--cflags", "libdpdk"], capture_output=True, text=True)
    if flags.returncode != 0:
        pytest.fail("DPDK's headers absent (pkg-config libdpdk): run `make deps` (libdpdk-dev)")
    config = out_dir / "embnic_config.h"  # what the dataplane Makefile writes (its CONFIG_H)
    config.write_text(f'#define EMBNIC_PROTO_VERSION {consts.VERSION}\n#define EMBNIC_GIT_REV "test"\n')
    so = out_dir / "libparse.so"
    r = subprocess.run([cc, "-O1", "-fPIC", "-shared", "-std=gnu11", "-Wall", "-Werror", "-I", str(DP / "include"),
                        "-I", str(DP.parent / "include"), *flags.stdout.split(), "-include", str(config), str(DP / "parse.c"), "-o", str(so)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    lib = ctypes.CDLL(str(so))
    lib.embnic_parse.restype = ctypes.c_int
    lib.embnic_parse.argtypes = [ctypes.c_char_p, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint32,
                                 ctypes.c_void_p]
    lib.embnic_drop_name.restype = ctypes.c_char_p
    lib.embnic_drop_name.argtypes = [ctypes.c_uint]
    info = ctypes.create_string_buffer(256)  # struct embnic_pkt_info (48 bytes)

    def verdict(frame: bytes, csum_ok: int = 0) -> str | None:
        rc = lib.embnic_parse(frame, len(frame), len(frame), csum_ok, 0, info)
        assert rc >= 0, rc  # not ARP
        return None if rc == 0 else lib.embnic_drop_name(rc).decode()

    return verdict

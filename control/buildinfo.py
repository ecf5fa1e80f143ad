"""Read and check the build info that ``embnic-dp`` carries in its ELF section ``.embnic_buildinfo``
(its layout: docs/control-socket.md, ``dataplane/include/embnic_buildinfo.h``).

:func:`check` compares it against :mod:`embnic.client_lib.consts` (protocol version, header
length, UDP port, and every header field's name, offset and size); ``embnic pipeline load``
refuses a binary with any difference.
"""
from __future__ import annotations

import dataclasses
import struct
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from embnic.client_lib import consts
from embnic.control.errors import NEEDS_ROOT, USAGE, NeedsRootError, OperationalError

SECTION = ".embnic_buildinfo"
MAGIC = b"EMBNICBI"
MAX_FIELDS = 24
_HEAD = struct.Struct("<8s9I")
_FIELD = struct.Struct("<16sHH")
_TAIL = struct.Struct("<41s32s")
SIZE = _HEAD.size + MAX_FIELDS * _FIELD.size + _TAIL.size  #: 597 bytes


class BuildInfoError(OperationalError):
    """The binary is a damaged ELF, has no/invalid build info, or does not match (exit 1)."""


class BinaryArgumentError(BuildInfoError):
    """The binary given does not exist, is a directory or is no ELF file at all: a usage error (exit 2)."""

    category = USAGE


class BinaryPermissionError(BuildInfoError, NeedsRootError):
    """This user may not read the binary: run as root (exit 2, like every "needs root")."""

    category = NEEDS_ROOT


@dataclasses.dataclass(frozen=True)
class BuildInfo:
    """Build info of one binary; ``fields`` are ``(name, offset, size)`` as in ``consts.HEADER_FIELDS``."""

    info_version: int
    proto_version: int
    hdr_len: int
    udp_port: int
    ring_size: int
    route_table_size: int
    client_table_size: int
    state_table_size: int
    fields: tuple[tuple[str, int, int], ...]
    git_rev: str
    dpdk_version: str
    path: str | None = None

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["fields"] = [{"name": n, "offset": o, "size": s} for n, o, s in self.fields]
        return d


def _cstr(b: bytes) -> str:
    return b.split(b"\0", 1)[0].decode("ascii", "replace")


def parse(data: bytes, path: str | None = None) -> BuildInfo:
    """Parse the raw bytes of the ``.embnic_buildinfo`` section.

    Raises:
        BuildInfoError: section too short, wrong magic, or ``n_fields > 24``.
    """
    where = f"{path}: " if path else ""
    if len(data) < SIZE:
        raise BuildInfoError(f"{where}section {SECTION} is {len(data)} bytes, expected {SIZE}: "
                             "rebuild the binary with `make -C dataplane`")
    magic, info_v, proto_v, hdr_len, udp, ring, routes, clients, states, n = _HEAD.unpack_from(data, 0)
    if magic != MAGIC:
        raise BuildInfoError(f"{where}section {SECTION} has magic {magic!r}, expected {MAGIC!r}: "
                             "not an embnic-dp build info")
    if n > MAX_FIELDS:
        raise BuildInfoError(f"{where}build info says {n} header fields, at most {MAX_FIELDS} fit")
    fields = tuple((_cstr(name), off, size)
                   for name, off, size in _FIELD.iter_unpack(data[_HEAD.size:_HEAD.size + n * _FIELD.size]))
    git_rev, dpdk = _TAIL.unpack_from(data, _HEAD.size + MAX_FIELDS * _FIELD.size)
    return BuildInfo(info_v, proto_v, hdr_len, udp, ring, routes, clients, states, fields,
                     _cstr(git_rev), _cstr(dpdk), path)


def read(path: str | Path) -> BuildInfo:
    """Read the build info of the ELF binary at ``path`` (with pyelftools).

    Raises:
        BinaryArgumentError: no such file, a directory, or a file that is no ELF at all
            (exit 2: give the right path).
        BinaryPermissionError: not allowed to read it (exit 2).
        BuildInfoError: a damaged/truncated ELF, or no ``.embnic_buildinfo`` section.
    """
    p = str(path)
    try:
        with open(p, "rb") as f:
            try:
                elf = ELFFile(f)
                sec = elf.get_section_by_name(SECTION)
                data = sec.data() if sec is not None else None
            except (ELFError, struct.error, ValueError, EOFError) as e:
                if not _has_elf_magic(p):
                    raise BinaryArgumentError(f"{p}: not an ELF binary: give the path of embnic-dp "
                                         "(built by `make -C dataplane`)") from None
                raise BuildInfoError(f"{p} is not a valid ELF binary ({e or type(e).__name__}; truncated or "
                                     "damaged?): rebuild with `make -C dataplane`") from None
            if sec is None:
                raise BuildInfoError(f"{p}: no {SECTION} section: not an embnic-dp binary, or built "
                                     "without build info; rebuild with `make -C dataplane`")
    except FileNotFoundError:
        raise BinaryArgumentError(f"{p}: no such file: build it with `make -C dataplane` or give its path") from None
    except IsADirectoryError:
        raise BinaryArgumentError(f"{p}: is a directory: give the path of the embnic-dp binary") from None
    except PermissionError:
        raise BinaryPermissionError(f"{p}: permission denied: run as root (sudo embnic ...) or fix the "
                                    "file's mode") from None
    return parse(data, p)


def _has_elf_magic(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def check(bi: BuildInfo, udp_port: int | None = None) -> list[str]:
    """Differences between ``bi`` and the client library's protocol (empty list: compatible).

    Args:
        udp_port: the cluster's UDP port to check instead of ``consts.UDP_PORT``.
    Returns:
        one line per mismatch, e.g. ``"proto_version 2 != client library's 1"``.
    """
    out = []
    if bi.info_version != 1:
        out.append(f"info_version {bi.info_version} != 1 (build info layout this tool reads)")
    if bi.proto_version != consts.VERSION:
        out.append(f"proto_version {bi.proto_version} != client library's {consts.VERSION}")
    if bi.hdr_len != consts.HDR_LEN:
        out.append(f"hdr_len {bi.hdr_len} != client library's {consts.HDR_LEN}")
    want_port = consts.UDP_PORT if udp_port is None else udp_port
    if bi.udp_port != want_port:
        src = "cluster.udp_port" if udp_port is not None else "client library's"
        out.append(f"udp_port {bi.udp_port} != {src} {want_port}")
    want = {n: (o, s) for n, o, s in consts.HEADER_FIELDS}
    have = {n: (o, s) for n, o, s in bi.fields}
    for n, (o, s) in want.items():
        if n not in have:
            out.append(f"header field {n} missing from the binary")
        elif have[n] != (o, s):
            out.append(f"header field {n} at offset {have[n][0]} size {have[n][1]} != "
                       f"client library's offset {o} size {s}")
    return out + [f"header field {n} unknown to the client library" for n in have if n not in want]


def require_compatible(path: str | Path, udp_port: int | None = None) -> BuildInfo:
    """Read ``path``'s build info and raise unless it matches the client library.

    Raises:
        BuildInfoError: unreadable, or one line listing the mismatches and the fix.
    """
    bi = read(path)
    diffs = check(bi, udp_port)
    if diffs:
        raise BuildInfoError(f"refusing {path}: built for another protocol ({'; '.join(diffs)}); "
                             "rebuild it with `make -C dataplane` from this checkout")
    return bi

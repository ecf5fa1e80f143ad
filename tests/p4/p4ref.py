"""Reference models of the P4 program for the tests: its header layouts read from the source
(checked against the protocol's field table), and the state map's home slot as each
architecture hashes it."""
from __future__ import annotations

import functools
import re
import struct
import zlib
from pathlib import Path
from typing import Sequence

from embnic.control.targets import p4program as p4prog

_TYPEDEF = re.compile(r"\btypedef\s+bit<(\d+)>\s+(\w+)\s*;")
_HEADER = re.compile(r"\bheader\s+(\w+)\s*\{(.*?)\}", re.S)
_FIELD = re.compile(r"^\s*(bit<(\d+)>|\w+)\s+(\w+)\s*;", re.M)


def _source(name: str) -> str:
    return p4prog.strip_comments((p4prog.P4_DIR / name).read_text())


@functools.lru_cache(maxsize=None)
def typedef_widths() -> dict[str, int]:
    """``typedef bit<N> name_t;`` of ``p4/types.p4`` as ``{name_t: N}`` (bits)."""
    return {m.group(2): int(m.group(1)) for m in _TYPEDEF.finditer(_source("types.p4"))}


def header_fields(header: str, source: str = "headers.p4") -> tuple[tuple[str, int, int], ...]:
    """Fields of ``header`` (e.g. ``"embnic_t"``) as ``(name, byte offset, byte size)``.

    Widths come from ``bit<N>`` or a typedef of ``types.p4``; every field must be whole bytes
    on a byte boundary (the embnic header's are).

    Raises:
        P4SourceError: no such header, an unknown field type, or a field that is not a whole
            number of bytes or does not start on a byte.
    """
    widths = typedef_widths()
    for m in _HEADER.finditer(_source(source)):
        if m.group(1) != header:
            continue
        out, bit = [], 0
        for f in _FIELD.finditer(m.group(2)):
            typ, width, name = f.group(1), f.group(2), f.group(3)
            w = int(width) if width else widths.get(typ)
            if w is None:
                raise p4prog.P4SourceError(f"{header}.{name}: unknown type {typ}")
            if bit % 8 or w % 8:
                raise p4prog.P4SourceError(f"{header}.{name}: {w} bits at bit {bit} is not whole bytes")
            out.append((name, bit // 8, w // 8))
            bit += w
        return tuple(out)
    raise p4prog.P4SourceError(f"no header {header} in p4/{source}")


def _crc32c_table() -> list[int]:
    out = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
        out.append(c)
    return out


_CRC32C = _crc32c_table()


def crc32c_raw(data: bytes, init: int = 0) -> int:
    """CRC-32C (Castagnoli, reflected) of ``data`` from ``init`` with no final XOR: DPDK's
    ``rte_hash_crc(data, len, init)`` — the SSE4.2 ``crc32`` instruction — which the SWX
    pipeline's ``crc32`` hash is (``rte_swx_pipeline.c`` registers it; seed 0)."""
    c = init
    for b in data:
        c = _CRC32C[(c ^ b) & 0xFF] ^ (c >> 8)
    return c


def state_slot(client_id: int, msg_id: int, arch: str = "v1model", slots: int | None = None) -> int:
    """The home slot the program on ``arch`` gives (client_id, msg_id) (p4/state_map.p4,
    ``EMBNIC_SLOT_HASH``; the message is there, or in the neighbour ``home ^ 1`` when another
    live message held the home slot when it came):

    * ``v1model``: zlib's CRC-32 of ``be16 client_id ++ be32 msg_id``, mod STATE_SLOTS (BMv2's
      ``HashAlgorithm.crc32``);
    * ``pna``: the SWX pipeline's ``crc32`` (:func:`crc32c_raw`, seed 0) over the 6 bytes
      p4c-dpdk copies the two fields into — its metadata, host order: ``le16 client_id ++
      le32 msg_id`` — its top log2(STATE_SLOTS) bits (STATE_SLOTS a power of two; the low
      bits of this CRC over consecutive msg_ids reach only half the slots).

    Raises:
        ValueError: an unknown ``arch``, or ids that do not fit 16/32 bits.
    """
    slots = slots or p4prog.constants()["STATE_SLOTS"]
    if not (0 <= client_id <= 0xFFFF and 0 <= msg_id <= 0xFFFFFFFF):
        raise ValueError("client_id must fit 16 bits and msg_id 32 bits")
    if arch == "v1model":
        return zlib.crc32(struct.pack(">HI", client_id, msg_id)) % slots
    if arch == "pna":
        return crc32c_raw(struct.pack("<HI", client_id, msg_id)) >> (33 - slots.bit_length())
    raise ValueError(f"unknown architecture {arch!r} (v1model, pna)")


def state_slots(client_id, msg_id, slots: int | None = None):
    """:func:`state_slot` on v1model of numpy arrays of equal shape (``uint16``/``uint32``-valued
    ints): an int64 array of the same shape (an int for scalars)."""
    import numpy as np

    c = np.asarray(client_id, dtype=np.int64)
    m = np.asarray(msg_id, dtype=np.int64)
    if c.shape != m.shape:
        raise ValueError(f"client_id shape {c.shape} != msg_id shape {m.shape}")
    out = np.fromiter((state_slot(int(a), int(b), slots=slots) for a, b in zip(c.ravel(), m.ravel())),
                      dtype=np.int64, count=c.size)
    return int(out[0]) if c.ndim == 0 else out.reshape(c.shape)


_TABLE = re.compile(r"\btable\s+(\w+)\s*\{")
_INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)


def tables() -> dict[str, str]:
    """Every ``table NAME { ... }`` of the program as ``{NAME: body}`` (over all of ``p4/``)."""
    out = {}
    for path in sorted(p4prog.P4_DIR.rglob("*.p4")):
        text = p4prog.strip_comments(path.read_text())
        for m in _TABLE.finditer(text):
            depth, i = 1, m.end()
            while depth and i < len(text):
                depth += {"{": 1, "}": -1}.get(text[i], 0)
                i += 1
            out[m.group(1)] = text[m.end():i - 1]
    return out


def source_files(main: Path | None = None, include_dirs: Sequence[Path] = ()) -> list[Path]:
    """Every file one compile of ``main`` reads: ``main`` and, transitively, each ``#include
    "x"`` (relative to the including file) and each ``#include <x>`` found in ``include_dirs``
    (the compiler's own ``p4include``: ``core.p4``, ``v1model.p4``, ``dpdk/pna.p4``), in the
    order first met. Includes inside comments are ignored; a ``<x>`` not found in
    ``include_dirs`` is left out.

    Raises:
        p4prog.P4SourceError: a quoted include names a file that does not exist.
    """
    main = Path(main or p4prog.MAINS["v1model"]).resolve()
    seen: list[Path] = []
    todo = [main]
    while todo:
        path = todo.pop(0)
        if path in seen:
            continue
        seen.append(path)
        for kind, name in _INCLUDE.findall(p4prog.strip_comments(path.read_text())):
            if kind == '"':
                inc = (path.parent / name).resolve()
                if not inc.is_file():
                    raise p4prog.P4SourceError(f"{path}: #include \"{name}\": no such file {inc}")
                todo.append(inc)
            else:
                for d in include_dirs:
                    if (Path(d) / name).is_file():
                        todo.append((Path(d) / name).resolve())
                        break
    return seen

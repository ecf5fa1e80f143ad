"""Classic pcap files (libpcap format, Ethernet link type): the one writer and reader of the project.

Frames are written unchanged — any length, even shorter than an Ethernet header (the card must
drop those).

Example::

    from embnic.control.pcap import read_pcap, write_pcap
    write_pcap("t.pcap", [frame0, frame1], times=[0.0, 0.001])
    [(0.0, frame0), (0.001, frame1)] == read_pcap("t.pcap")
"""
from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Sequence

_MAGIC_US, _MAGIC_NS = 0xA1B2C3D4, 0xA1B23C4D
_HEADER = struct.Struct("<IHHiIII")   # magic, version 2.4, thiszone, sigfigs, snaplen, linktype
_RECORD = struct.Struct("<IIII")      # ts_sec, ts_usec, incl_len, orig_len
HEADER_LEN = _HEADER.size              #: bytes of the file header (24): a shorter file has no frames yet
LINKTYPE_ETHERNET = 1
SNAPLEN = 65535


def write_pcap(path: str | os.PathLike, frames: Sequence[bytes], times: Sequence[float] | None = None) -> int:
    """Write Ethernet frames to a classic (microsecond) pcap file.

    Args:
        path: the file (overwritten).
        frames: the frames, written byte for byte.
        times: each frame's timestamp in seconds (same length as ``frames``); None: 1 s + i µs
            for frame i (distinct and increasing).
    Returns:
        the number of frames written.
    Raises:
        ValueError: ``times`` and ``frames`` differ in length.
        OSError: the file cannot be written.
    """
    if times is not None and len(times) != len(frames):
        raise ValueError(f"{len(times)} timestamps for {len(frames)} frames")
    with open(path, "wb") as f:
        f.write(_HEADER.pack(_MAGIC_US, 2, 4, 0, 0, SNAPLEN, LINKTYPE_ETHERNET))
        for i, d in enumerate(frames):
            if times is None:
                sec, usec = 1 + i // 1_000_000, i % 1_000_000
            else:
                sec = int(times[i])
                usec = int(round((times[i] - sec) * 1e6))
                if usec >= 1_000_000:
                    sec, usec = sec + 1, usec - 1_000_000
            f.write(_RECORD.pack(sec, usec, len(d), len(d)))
            f.write(d)
    return len(frames)


def _file_header(data: bytes, path) -> tuple[str, int]:
    """``(struct byte order, magic)`` of a classic pcap file starting with ``data``; ValueError if it is none."""
    if len(data) < _HEADER.size:
        raise ValueError(f"{path} is not a pcap file ({len(data)} bytes, shorter than a pcap header)")
    for end in ("<", ">"):
        magic = struct.unpack_from(end + "I", data)[0]
        if magic in (_MAGIC_US, _MAGIC_NS):
            return end, magic
    raise ValueError(f"{path} is not a pcap file (magic {data[:4].hex()}; pcapng is not read)")


def check_pcap(path: str | os.PathLike) -> None:
    """Check that ``path`` starts with a classic pcap file header (reads only the header).

    Raises:
        OSError: the file cannot be read.
        ValueError: it is not a classic pcap file (too short, or names the magic found).
    """
    with open(path, "rb") as f:
        _file_header(f.read(_HEADER.size), path)


def partial_tail(path: str | os.PathLike) -> int:
    """Bytes at the end of classic pcap file ``path`` that form no whole record (a copy cut short
    mid-record; :func:`read_pcap` leaves them out): 0 for a whole file.

    Raises:
        OSError: the file cannot be read.
        ValueError: it is not a classic pcap file (names the magic found).
    """
    data = Path(path).read_bytes()
    off = _HEADER.size
    for start, _, _, incl in _records(data, _file_header(data, path)[0]):
        off = start + incl
    return len(data) - off


def read_pcap(path: str | os.PathLike) -> list[tuple[float, bytes]]:
    """``(timestamp s, frame bytes)`` of every record of a classic pcap file (micro- or nanosecond
    timestamps, either byte order). A record cut short at the end of the file is left out.

    Raises:
        OSError: the file cannot be read.
        ValueError: it is not a classic pcap file (names the magic found).
    """
    data = Path(path).read_bytes()
    end, magic = _file_header(data, path)
    scale = 1e-6 if magic == _MAGIC_US else 1e-9
    return [(sec + frac * scale, data[start:start + incl]) for start, sec, frac, incl in _records(data, end)]


def _records(data: bytes, end: str):
    """``(offset of its frame, ts seconds, ts fraction, captured length)`` of every whole record
    after the file header of ``data`` (byte order ``end``)."""
    rec = struct.Struct(end + "IIII")
    off = _HEADER.size
    while off + rec.size <= len(data):
        sec, frac, incl, _ = rec.unpack_from(data, off)
        if off + rec.size + incl > len(data):
            return
        yield off + rec.size, sec, frac, incl
        off += rec.size + incl

"""The user-space netem helper of one link: ``python -m embnic.testbed.net.netem_helper --iface IF ...``.

Started by :func:`embnic.testbed.net.netem.apply` (``user`` backend) inside the peer's namespace:
frames from the peer's tap are impaired (loss, reordering, duplicates, delay; :class:`_Direction`)
and sent on the veth, and the other way round; counters go to a stats file.
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import random
import select
import signal
import socket
import struct
import time

from embnic.testbed.net.netem import Impairment
_TUNSETIFF = 0x400454CA
_IFF_TAP = 0x0002
_IFF_NO_PI = 0x1000
_SOL_PACKET = 263
_PACKET_QDISC_BYPASS = 20


def _open_tap(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", name.encode(), _IFF_TAP | _IFF_NO_PI))
    os.set_blocking(fd, False)
    return fd


class _Direction:
    """Per-direction impairment state (netem-like decisions, one RNG per direction)."""

    def __init__(self, name: str, imp: Impairment, seed: int, send):
        self.name = name
        self.loss = imp.loss / 100.0
        self.dup = imp.duplicate / 100.0
        self.reorder = imp.reorder / 100.0
        self.hold_s = max(imp.delay_ms, 0.1) / 1000.0
        self.rng = random.Random(seed)
        self.send = send
        self.held: tuple[bytes, int] | None = None
        self.held_until = 0.0
        self.c = {"in": 0, "out": 0, "dropped": 0, "duplicated": 0, "reordered": 0, "send_errors": 0}

    def _emit(self, frame: bytes, copies: int) -> None:
        for _ in range(copies):
            try:
                self.send(frame)
                self.c["out"] += 1
            except OSError:
                self.c["send_errors"] += 1

    def frame(self, frame: bytes, now: float) -> None:
        self.c["in"] += 1
        r = self.rng.random
        if r() < self.loss:
            self.c["dropped"] += 1
            return
        copies = 1
        if r() < self.dup:
            copies = 2
            self.c["duplicated"] += 1
        if self.held is None and r() < self.reorder:
            self.held = (frame, copies)
            self.held_until = now + self.hold_s
            self.c["reordered"] += 1
            return
        self._emit(frame, copies)
        self.tick(float("inf"))  # a held frame goes out after it

    def tick(self, now: float) -> float | None:
        """Release a held frame whose time is up; returns seconds until the next deadline."""
        if self.held is not None and now >= self.held_until:
            self._emit(*self.held)
            self.held = None
        return None if self.held is None else self.held_until - now


def impair_loop(iface: str, tap_out: str, tap_in: str, mac: str, imp: Impairment, stats_path: str) -> None:
    """The user-space netem helper (runs in the client's/shard's namespace until SIGTERM).

    Reads frames the ``clsact`` redirects put on ``tap_out`` (leaving the node) and ``tap_in``
    (arriving from the card), impairs each direction (:class:`Impairment`) and forwards:
    outgoing ones on ``iface`` via AF_PACKET with ``PACKET_QDISC_BYPASS``, incoming ones into
    ``tap_in`` (received by the kernel as if on ``iface``). Writes counters to ``stats_path``
    (JSON) when ready, every 0.5 s and on exit.
    """
    fo, fi = _open_tap(tap_out), _open_tap(tap_in)
    tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    tx.bind((iface, 0))
    tx.setsockopt(_SOL_PACKET, _PACKET_QDISC_BYPASS, 1)
    own = bytes.fromhex(mac.replace(":", ""))
    d_out = _Direction("out", imp, imp.seed * 2, tx.send)
    d_in = _Direction("in", imp, imp.seed * 2 + 1, lambda f: os.write(fi, f))
    stop = []
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    signal.signal(signal.SIGINT, lambda *a: stop.append(1))

    def dump() -> None:
        tmp = stats_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"out": d_out.c, "in": d_in.c, "ignored": ignored, "pid": os.getpid(),
                       "impairment": imp.as_dict()}, f)
        os.replace(tmp, stats_path)

    ignored = 0
    dump()
    print(f"netem helper on {iface}: {imp.as_dict()}", flush=True)
    next_dump = time.monotonic() + 0.5
    while not stop:
        now = time.monotonic()
        waits = [w for w in (d_out.tick(now), d_in.tick(now)) if w is not None]
        timeout = min(waits + [max(0.0, next_dump - now)])
        try:
            ready, _, _ = select.select([fo, fi], [], [], timeout)
        except InterruptedError:
            continue
        now = time.monotonic()
        for fd in ready:
            while True:
                try:
                    f = os.read(fd, 65536)
                except BlockingIOError:
                    break
                if len(f) < 14:
                    continue
                leaving = fd == fo
                # leaving: only this node's stack's frames (not the tap's own); arriving: only the card's
                # (not the kernel talking on the tap)
                if (f[6:12] == own) != leaving:
                    ignored += 1
                    continue
                (d_out if leaving else d_in).frame(f, now)
        if now >= next_dump:
            dump()
            next_dump = now + 0.5
    for d in (d_out, d_in):
        d.tick(float("inf"))  # a held frame goes out now
    dump()


def main(argv: list[str] | None = None) -> None:
    """``python -m embnic.testbed.net.netem_helper --iface IF --tap-out T --tap-in T --mac M ...`` (the helper)."""
    ap = argparse.ArgumentParser(prog="embnic.testbed.net.netem_helper", description="user-space netem helper (one link)")
    for flag, default in (("--iface", None), ("--tap-out", None), ("--tap-in", None), ("--mac", None),
                          ("--loss", 0.0), ("--reorder", 0.0), ("--duplicate", 0.0), ("--delay", 5.0),
                          ("--seed", 1), ("--stats", None)):
        kw = {"required": True} if default is None else {"type": type(default), "default": default}
        ap.add_argument(flag, **kw)
    a = ap.parse_args(argv)
    imp = Impairment(a.loss, a.reorder, a.duplicate, a.delay, a.seed)
    impair_loop(a.iface, a.tap_out, a.tap_in, a.mac, imp, a.stats)


if __name__ == "__main__":
    main()

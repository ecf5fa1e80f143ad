"""Waits until a card run by a test has accounted every frame it was given: the DPDK card
(:class:`~embnic.control.targets.dpdk.process.CardProcess`) and the P4 card in embnic-swx
(:class:`~embnic.control.targets.p4dpdk.target.SwxProcess`)."""
from __future__ import annotations

import json
import time

from embnic.control.errors import OperationalError
from embnic.control.targets.dpdk.process import CardProcess, DpdkProcError
from embnic.control.targets.p4dpdk.target import SwxProcess


def wait_drained(card: CardProcess, n_frames: int, timeout: float = 30.0, mbufs_back: bool = False) -> dict:
    """Wait until the card has received ``n_frames`` and accounted every one of them.

    Every received frame is either sent (``tx_frames``) or dropped (``drops``; ``no_mbuf`` counts
    frames never received and is left out), and the header ring is empty. With ``mbufs_back``,
    also until every mbuf is back in the pool (``mempool.in_use == 0``): a lcore other than the
    control socket's counts a frame a moment before it frees its mbuf.

    Returns:
        the last ``counters`` response.
    Raises:
        DpdkProcError: not drained within ``timeout`` s (the message holds the counters).
    """
    deadline = time.monotonic() + timeout
    while True:
        c = card.counters()
        rx = sum(p["rx_frames"] for p in c["ports"])
        done = sum(p["tx_frames"] for p in c["ports"]) + sum(
            v for k, v in c["drops"].items() if k != "no_mbuf")
        if rx >= n_frames and done >= rx and c["ring"]["count"] == 0 and (
                not mbufs_back or c["mempool"]["in_use"] == 0):
            return c
        if time.monotonic() > deadline:
            raise DpdkProcError(f"card did not drain {n_frames} frames within {timeout:g}s: rx={rx} "
                                f"accounted={done} counters={json.dumps(c)}")
        time.sleep(0.05)


def wait_swx_drained(sw: SwxProcess, n_frames: int, timeout: float = 60.0) -> dict:
    """Wait until the host took ``n_frames`` in and every one left the pipeline (sent on its
    port, or dropped by the pipeline or the host); returns the host's counters.

    Raises:
        OperationalError: not so within ``timeout`` s (the counters in the message).
    """
    deadline = time.monotonic() + timeout
    while True:
        h = sw.host_counters()
        ports = h["ports"]
        rx = sum(p["rx_frames"] for p in ports)
        lost_in = sum(p["rx_ring_full"] + p["rx_no_headroom"] for p in ports)
        into = sum(p["pipeline_in_frames"] for p in ports)
        out = sum(p["pipeline_out_frames"] for p in ports)
        done = sum(p["tx_frames"] + p["tx_full"] + p["tx_bad_meta"] for p in ports)
        if rx >= n_frames and into == rx - lost_in and into == out + h["pipeline_dropped"] and done == out:
            return h
        if time.monotonic() > deadline:
            raise OperationalError(f"embnic-swx did not drain {n_frames} frames in {timeout:g} s: {h} "
                                   f"(log: {sw.proc.log_path})")
        time.sleep(0.05)

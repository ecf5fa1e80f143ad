"""``embnic status``: counters, drops by reason, ring occupancy and high-water mark, state-map summary."""
from __future__ import annotations

import contextlib
import itertools
import json
import time

import click
import numpy as np

from embnic.client_lib import consts
from embnic.control.card_metrics import latency_bucket_upper_us
from embnic.cli.commands.options import FloatRange, json_option, pipeline_options
from embnic.control.settings import open_target, resolve


def _pct(n: int, d: int) -> str:
    return f"{100.0 * n / d:.1f}%" if d else "-"


def _counts(cur: dict, prev: dict, dt: float | None, keys, sep: str = "  ") -> str:
    """``name count`` for each of ``keys`` of ``cur``, with `` (rate/s)`` where ``prev`` has it and ``dt``."""
    return sep.join(f"{k} {cur.get(k, 0):,}" + ("" if prev.get(k) is None or not dt else
                                                 f" ({(cur.get(k, 0) - prev[k]) / dt:,.0f}/s)") for k in keys)


def latency_quantiles(hist: list[int], qs=(0.5, 0.99)) -> dict[float, float]:
    """``{q: µs}`` for each quantile ``q`` in (0, 1] of a card latency histogram (counts per bucket,
    ``shards[].latency_hist``): the upper bound of the bucket holding it; empty when ``hist`` counts
    nothing. ``latency_quantiles([0, 3, 1], (0.5,))`` → ``{0.5: 2.0}`` (3 of 4 samples < 2 µs)."""
    cum = np.cumsum(hist)
    # the first bucket whose running count reaches q of all
    return {q: latency_bucket_upper_us(min(int(np.searchsorted(cum, q * cum[-1])), len(hist) - 1), len(hist))
            for q in sorted(qs)} if len(hist) and cum[-1] else {}


def _us(v: float) -> str:
    return "inf" if v == float("inf") else f"{v:,.0f}"


def sample(t) -> dict:
    """One status sample of target ``t``: ``{"t": unix seconds, "counters": {...}, "state": {...}}``."""
    return {"t": time.time(), "counters": t.counters(), "state": t.state_summary()}


def render(cur: dict, prev: dict | None = None, show_all: bool = False, title: str = "") -> str:
    """Text view of a :func:`sample` (rates per second against ``prev`` when given)."""
    c, st = cur["counters"], cur["state"]
    pc = (prev or {}).get("counters") or {}
    dt = (cur["t"] - prev["t"]) if prev else None
    out = [title] if title else []
    ctl = c.get("control")
    if ctl:  # bmv2: which channel programs the tables, which reads registers and counters
        out.append(f"control   {ctl['channel']} ({ctl['switch']}): tables over {ctl['tables']}; "
                   f"registers, counters over {ctl['registers']}")
    prev_ports = {p.get("port"): p for p in pc.get("ports", [])}
    ports = c.get("ports", [])
    # columns (key, title, width, gap before it); the DPDK card's: the largest frame each port sends, the
    # frames dropped for being longer (by the port they were for); bmv2's: frames the port's interface took
    # in that the switch never counted (lost in its capture)
    cols = [("rx_frames", "rx frames", 14, "  "), ("rx_bytes", "rx bytes", 16, " "),
            ("tx_frames", "tx frames", 14, "  "), ("tx_bytes", "tx bytes", 16, " ")]
    if any("max_frame" in p for p in ports):
        cols.append(("max_frame", "max frame", 9, "  "))
    if any(p.get("too_long_for_port") or (show_all and "too_long_for_port" in p) for p in ports):
        cols.append(("too_long_for_port", "too long", 10, "  "))
    if any("lost_before_switch" in p for p in ports):
        cols += [("iface_rx_frames", "iface rx", 14, "  "), ("lost_before_switch", "lost before switch", 18, " ")]
    out.append(f"{'port':>4}" + "".join(f"{gap}{title:>{w}}" for _, title, w, gap in cols)
               + (f"  {'rx frames/s':>12} {'tx frames/s':>12}" if dt else ""))
    for p in ports:
        pp = prev_ports.get(p.get("port"), {})
        out.append(f"{p.get('port'):>4}" + "".join(f"{gap}{p.get(k, 0):>{w},}" for k, _, w, gap in cols) + "".join(
            f"  {(p.get(k, 0) - pp.get(k, p.get(k, 0))) / dt:>12,.0f}" for k in ("rx_frames", "tx_frames") if dt))
    types = c.get("types", {})
    names = [t.name for t in consts.MsgType] + sorted(set(types) - {t.name for t in consts.MsgType})
    # the card counts frames per message type (a message of N fragments counts N); messages: the state map below
    out.append("frames by message type  " + _counts(types, pc.get("types", {}), dt,
                                                    [n for n in names if n in types or show_all]))
    drops = c.get("drops", {})
    shown = sorted((k for k, v in drops.items() if v or show_all), key=lambda k: -drops[k])
    out.append(f"drops     total {sum(drops.values()):,}"
               + (": " + _counts(drops, pc.get("drops", {}), dt, shown, ", ") if shown else ""))
    r = c.get("ring", {})
    size = r.get("size", 0)
    out.append(f"ring      {r.get('count', 0):,}/{size:,} ({_pct(r.get('count', 0), size)}), "
               f"high water {r.get('high_water', 0):,} ({_pct(r.get('high_water', 0), size)})")
    m = c.get("mempool")
    if m:
        out.append(f"mempool   in use {m.get('in_use', 0):,}/{m.get('size', 0):,} ({_pct(m.get('in_use', 0), m.get('size', 0))}), "
                   f"available {m.get('available', 0):,}")
    host = c.get("host")
    if host:  # the p4dpdk target: embnic-swx around the SWX pipeline
        hp = host.get("ports", [])
        out.append(f"host      embnic-swx: into the pipeline {sum(p.get('pipeline_in_frames', 0) for p in hp):,}, "
                   f"out of it {sum(p.get('pipeline_out_frames', 0) for p in hp):,}, dropped by it "
                   f"{host.get('pipeline_dropped', 0):,}; lost on the host: input ring full "
                   f"{sum(p.get('rx_ring_full', 0) for p in hp):,}, TX full {sum(p.get('tx_full', 0) for p in hp):,}")
    by = st.get("by_state", {})
    out.append(f"state     {st.get('entries', 0):,}/{st.get('capacity', 0):,} messages in flight in the state map "
               f"({', '.join(f'{k} {v:,}' for k, v in by.items())}); overflow {st.get('overflow', 0):,}, "
               f"expired {st.get('expired', 0):,}")
    parts = st.get("by_partition", [])
    if len(parts) > 1:  # the map split over several state lcores: each one's share
        out.append("          partitions  " + "  ".join(
            f"{p['partition']} (lcore {p['lcore']}): {p['entries']:,} in flight, "
            f"{p['completed_since_start']:,} completed since start" for p in parts))
    done = c.get("completed")
    if done is not None:
        out.append("completed messages by reply type  " + _counts(done, pc.get("completed", {}), dt, done))
    for sh in c.get("shards", []):
        hist = sh.get("latency_hist", [])
        n = sum(hist) if "latency_hist" in sh else sh.get("completed", 0)  # bmv2: a count, no histogram
        name = "other" if sh.get("shard", -1) < 0 else sh.get("shard")
        line = (f"shard {name:>5}  completed {n:,}, expired {sh.get('expired', 0):,}")
        if n and hist:
            q = latency_quantiles(hist)
            line += (f"; request->reply on the card: mean {sh.get('latency_sum_ns', 0) / n / 1000:,.1f} µs, "
                     f"p50 < {_us(q[0.5])} µs, p99 < {_us(q[0.99])} µs")
        out.append(line)
    return "\n".join(out)


@click.command()
@pipeline_options
@json_option
@click.option("--watch", "watch", type=FloatRange(0.1, 3600), is_flag=False, flag_value=1.0, default=None,
              metavar="[SEC]", help="Redraw every SEC seconds (0.1..3600, default 1) until Ctrl-C; with --json, "
                                    "one JSON line per sample.")
@click.option("--count", type=click.IntRange(1), default=None, help="With --watch: stop after N samples.")
@click.option("--all", "show_all", is_flag=True, help="Show zero counters too (every drop reason).")
def status(config, target, name, ctl, as_json, watch, count, show_all):
    """Show the card's counters: frames per port, frames by message type (a message of N
    fragments counts N), drops by reason, header-ring occupancy and high-water mark, mempool use,
    the message state map, messages completed by reply type, and per shard the messages completed
    and expired and the request->reply latency the card measured (docs/cli.md).

    \b
    Examples:
      embnic status
      embnic status --json
      embnic status --watch 2
    """
    s = resolve(config, target, name, ctl)
    t = open_target(s)
    title = f"pipeline {s.name!r} ({s.target})"
    if watch is None:
        cur = sample(t)
        click.echo(json.dumps(cur, indent=2) if as_json else render(cur, show_all=show_all, title=title))
        return
    prev = None
    with contextlib.suppress(KeyboardInterrupt):
        for n in itertools.count(1):
            cur = sample(t)
            if as_json:
                click.echo(json.dumps(cur, separators=(",", ":")))
            else:
                click.clear()
                click.echo(render(cur, prev, show_all, f"{title} — every {watch:g}s, "
                                  f"{time.strftime('%H:%M:%S')} (Ctrl-C to stop)"))
            if count is not None and n >= count:
                return
            prev = cur
            time.sleep(watch)

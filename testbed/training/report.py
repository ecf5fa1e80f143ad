"""Report helpers of the main job and trace replay: JSON report, PNG plots, progress bar, summary.

Plots use matplotlib's ``Agg`` backend (no display needed). The progress bar is tqdm on
stderr (disabled when stderr is not a terminal unless forced).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import sys
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np


def percentiles(values_us: Sequence[float] | np.ndarray) -> dict:
    """Latency summary of ``values_us`` (µs): ``{p50, p90, p99, max, mean, n}`` (None when empty).

    Percentiles use numpy's default (linear interpolation between closest ranks).
    """
    a = np.asarray(values_us, dtype=np.float64)
    if a.size == 0:
        return {"p50": None, "p90": None, "p99": None, "max": None, "mean": None, "n": 0}
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {"p50": round(float(p50), 1), "p90": round(float(p90), 1), "p99": round(float(p99), 1),
            "max": round(float(a.max()), 1), "mean": round(float(a.mean()), 1), "n": int(a.size)}


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, Path):
        return str(x)
    return x


def write_json(path: str | os.PathLike, report: dict) -> Path:
    """Write ``report`` as indented JSON (numpy scalars/arrays converted; NaN/inf → null)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(_jsonable(report), indent=2) + "\n")
    os.replace(tmp, p)
    return p


def _axes():
    """(pyplot on the ``Agg`` backend, figure, axes) of a new 7 × 4 in figure at 110 dpi."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    return plt, fig, ax


def _save(plt, fig, ax, path: str | os.PathLike, title: str, **grid) -> Path:
    """Give ``ax`` its title and a light grid (``grid``: more keywords of ``Axes.grid``), write the
    figure to ``path`` (PNG) and close it; returns ``path``."""
    ax.set_title(title)
    ax.grid(alpha=0.3, **grid)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return Path(path)


def plot_loss(path: str | os.PathLike, series: dict[str, Sequence[float]], title: str = "training loss") -> Path:
    """Loss per step of one or more runs (``{label: losses}``) as a PNG."""
    plt, fig, ax = _axes()
    styles = ["-", "--", ":", "-."]
    for i, (label, ys) in enumerate(series.items()):
        ax.plot(np.arange(1, len(ys) + 1), ys, styles[i % len(styles)], label=label, linewidth=1.6)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("loss (mean BCE)")
    ax.legend()
    return _save(plt, fig, ax, path, title)


def plot_cdf(path: str | os.PathLike, series: dict[str, Sequence[float]], title: str,
             xlabel: str = "lookup latency (µs)") -> Path:
    """Empirical CDF of one or more samples (``{label: values}``) as a PNG, log-scaled x; the
    legend gives each sample's p50/p99, dotted lines mark them."""
    plt, fig, ax = _axes()
    for label, vs in series.items():
        v = np.sort(np.asarray(vs, dtype=np.float64))
        if v.size == 0:
            continue
        p50, p99 = np.percentile(v, [50, 99])
        (line,) = ax.step(v, np.arange(1, v.size + 1) / v.size, where="post",
                          label=f"{label}: n={v.size}, p50 {p50:,.0f}, p99 {p99:,.0f}")
        for x in (p50, p99):
            ax.axvline(x, linestyle=":", alpha=0.6, color=line.get_color())
    if any(len(vs) for vs in series.values()):
        ax.set_xscale("log")
        ax.legend(loc="upper left", fontsize=8)
    else:
        ax.text(0.5, 0.5, "no samples", transform=ax.transAxes, ha="center", va="center")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction ≤ x")
    ax.set_ylim(0, 1.02)
    return _save(plt, fig, ax, path, title, which="both")


def plot_grouped_bars(path: str | os.PathLike, groups: dict[str, dict[str, float]], title: str,
                      ylabel: str) -> Path:
    """Bars grouped by category: ``{series: {category: value}}`` (e.g. requests and replies per client)."""
    plt, fig, ax = _axes()
    cats = sorted({c for g in groups.values() for c in g}, key=str)
    width = 0.8 / max(1, len(groups))
    x = np.arange(len(cats))
    for i, (name, vals) in enumerate(groups.items()):
        ys = [vals.get(c, 0) for c in cats]
        bars = ax.bar(x + (i - (len(groups) - 1) / 2) * width, ys, width, label=name)
        ax.bar_label(bars, fontsize=8)
    ax.set_xticks(x, cats)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    return _save(plt, fig, ax, path, title, axis="y")


class Progress(contextlib.AbstractContextManager):
    """A tqdm progress bar (stderr) with a rate in the postfix; a no-op when disabled.

    Args:
        total: number of steps/frames.
        desc: label.
        unit: tqdm unit.
        enabled: None = only when stderr is a terminal.
    """

    def __init__(self, total: int, desc: str, unit: str = "step", enabled: bool | None = None):
        self.bar = None
        if enabled or (enabled is None and sys.stderr.isatty()):
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True, leave=True)

    def update(self, n: int = 1, **postfix) -> None:
        if self.bar is not None:
            self.set(self.bar.n + n, **postfix)

    def set(self, value: int, **postfix) -> None:
        """Move the bar to ``value``."""
        if self.bar is not None:
            if postfix:
                self.bar.set_postfix(postfix, refresh=False)
            if value != self.bar.n:
                self.bar.update(value - self.bar.n)

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def fmt_drops(d: dict | None) -> str:
    """``"bad_ip 3, unknown_client 1"`` (the non-zero counts) or ``"none"``."""
    return ", ".join(f"{k} {v}" for k, v in sorted((d or {}).items()) if v) or "none"


def card_summary(counters: dict, state_summary: dict | None) -> dict:
    """The ``card`` object of a report: from the card's ``counters`` (docs/control-socket.md) its
    frames by type, ports, ring, mempool, state, messages completed and latency by shard, and from
    its state map's summary the messages in it (``entries`` and by state; None without one)."""
    return {"frames_by_type": counters.get("types"), "ports": counters.get("ports"), "ring": counters.get("ring"),
            "mempool": counters.get("mempool"), "state": counters.get("state"),
            "messages_completed": counters.get("completed"), "latency_by_shard": counters.get("shards"),
            "messages_in_state_map": ({"entries": state_summary.get("entries"), **(state_summary.get("by_state") or {})}
                                      if state_summary else None)}


def table_lines(rows: Iterable[tuple[str, str]]) -> list[str]:
    """Aligned ``label  value`` lines."""
    rows = list(rows)
    w = max((len(k) for k, _ in rows), default=0)
    return [f"  {k:<{w}}  {v}" for k, v in rows]

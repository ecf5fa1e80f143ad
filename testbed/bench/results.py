"""The benchmarks' shared result file ``DIR/bench.json``: one JSON object, one key per benchmark."""
from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from pathlib import Path


def merge_json(path: Path, key: str, value: dict, *, update: bool = False) -> dict:
    """Read-modify-write ``path`` (a JSON object) setting ``key``, under an flock and with an
    atomic rename, so benchmarks writing one bench.json never lose each other's results; with
    ``update``, ``value``'s keys are added to what ``key`` holds (another run's figures stay).

    An existing file that is not a JSON object (damaged, hand-edited) is not dropped: it is
    renamed ``bench.json.unreadable-<UTC time>`` beside it, with one line on stderr naming it,
    and a new object holding only ``key`` is written.

    Returns:
        the whole object as written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "w") as lf:
        fcntl.flock(lf, fcntl.LOCK_EX)
        data = {}
        if path.exists():
            try:
                data = json.loads(path.read_text())
                problem = None if isinstance(data, dict) else f"holds a JSON {type(data).__name__}, not an object"
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                problem = f"is not valid JSON ({e})"
            if problem:
                kept = path.with_name(f"{path.name}.unreadable-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
                path.replace(kept)
                print(f"warning: {path} {problem}: kept as {kept}, writing a new one", file=sys.stderr)
                data = {}
        data[key] = {**data.get(key, {}), **value} if update else value
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        tmp.replace(path)
    return data


def at_least(bound: float, measured: float, note: str | None = None) -> dict:
    """A target met when ``measured >= bound``: ``{target, measured, met}`` (and ``note``)."""
    return {"target": bound, "measured": measured, "met": measured >= bound, **({"note": note} if note else {})}


def load_since(before: tuple[float, float, float]) -> dict:
    """``{loadavg_before, loadavg_after, cpus}``: the load average ``before`` (``os.getloadavg()``
    at the start of a run) and now, and this machine's CPUs."""
    return {"loadavg_before": list(before), "loadavg_after": list(os.getloadavg()), "cpus": os.cpu_count()}

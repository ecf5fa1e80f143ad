"""The benchmarks' shared result file ``DIR/bench.json``: one JSON object, one key per benchmark."""
from __future__ import annotations

import json
from pathlib import Path


def merge_json(path: Path, key: str, value: dict) -> dict:
    """Read-modify-write ``path`` (a JSON object) setting ``key``, under an flock and with an
    atomic rename, so benchmarks writing one bench.json never lose each other's results.

    Returns:
        the whole object as written.
    """
    import fcntl

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "w") as lf:
        fcntl.flock(lf, fcntl.LOCK_EX)
        data = {}
        if path.exists():
            try:
                data = json.loads(path.read_text())
            except json.JSONDecodeError:
                data = {}
        data[key] = value
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        tmp.replace(path)
    return data

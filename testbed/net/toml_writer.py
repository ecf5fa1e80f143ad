"""A small TOML writer for the effective cluster config the testbed writes (``tomllib`` only reads)."""
from __future__ import annotations

import json
import re
from typing import Any


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)  # also inf, -inf and nan as TOML spells them
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def _toml_key(k: str) -> str:
    return k if re.match(r"^[A-Za-z0-9_-]+$", k) else json.dumps(k)


def dump_toml(data: dict) -> str:
    """Serialise a dict as parsed by ``tomllib`` (tables, arrays of tables, scalars, lists) to TOML."""
    out: list[str] = []

    def table(d: dict, path: list[str]) -> None:
        scal = {k: v for k, v in d.items() if not isinstance(v, dict)
                and not (isinstance(v, list) and v and all(isinstance(x, dict) for x in v))}
        for k, v in scal.items():
            out.append(f"{_toml_key(k)} = {_toml_value(v)}")
        for k, v in d.items():
            if k in scal:
                continue
            p = path + [_toml_key(k)]
            if isinstance(v, dict):
                out.append(f"\n[{'.'.join(p)}]")
                table(v, p)
            else:
                for item in v:
                    out.append(f"\n[[{'.'.join(p)}]]")
                    table(item, p)

    table(data, [])
    return "\n".join(out).lstrip("\n") + "\n"

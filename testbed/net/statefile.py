"""The testbed's state file ``RUN_DIR/testbed-NAME.json`` and what it says about the nodes.

Written before anything is created (so ``down`` works after a crash) through
:mod:`embnic.control.runstate`; one log per node in ``RUN_DIR/testbed-NAME/``.
"""
from __future__ import annotations

from pathlib import Path

from embnic.control import runstate
from embnic.control.runstate import pid_matches, run_dir


def state_path(name: str, rdir: Path | None = None) -> Path:
    """``RUN_DIR/testbed-NAME.json``."""
    return runstate.state_path(rdir or run_dir(), f"testbed-{name}")


def node_dir(name: str, rdir: Path | None = None) -> Path:
    """``RUN_DIR/testbed-NAME/``: logs, effective config, card socket."""
    return (rdir or run_dir()) / f"testbed-{name}"


def testbed_state(name: str, rdir: Path | None = None) -> dict | None:
    """The state of testbed ``name`` (None if there is none; ``{"name", "corrupt": True, ...}`` if unreadable)."""
    st = runstate.read_state(rdir or run_dir(), f"testbed-{name}")
    return {"name": name, **st} if st is not None and st.get("corrupt") else st


def save_testbed_state(state: dict, rdir: Path | None = None) -> None:
    """Write the state file of testbed ``state["name"]`` atomically."""
    runstate.write_state(rdir or run_dir(), f"testbed-{state['name']}", state)


def list_testbeds(rdir: Path | None = None) -> list[str]:
    """Names of the testbeds that have a state file."""
    d = rdir or run_dir()
    try:
        return sorted(p.name[len("testbed-"):-len(".json")] for p in d.glob("testbed-*.json"))
    except OSError:
        return []


def card_pipeline_name(name: str) -> str:
    """The pipeline name (``[control] name``) of testbed ``name``'s effective config: ``NAME-card``,
    its card namespace's name. A card started from that config with ``embnic pipeline load -c
    RUN_DIR/testbed-NAME/cluster.toml`` (after ``testbed up --no-card``) has its state file
    ``RUN_DIR/NAME-card.json``, so the cards of two testbeds do not collide."""
    return f"{name}-card"


def loaded_card(name: str, rdir: Path | None = None) -> dict | None:
    """The state of the card that ``pipeline load`` started from testbed ``name``'s effective config
    (``RUN_DIR/NAME-card.json``, in the testbed's card namespace), or None if there is none.
    Not the card ``testbed up`` starts itself (that one is the testbed state's ``card``)."""
    st = runstate.read_state(rdir or run_dir(), card_pipeline_name(name))
    if st is None or st.get("corrupt"):
        return st
    return st if st.get("netns") in (None, card_pipeline_name(name)) else None


def card_target(target, name: str, rdir):
    """The card pipeline ``name`` in ``rdir`` as its :class:`~embnic.control.targets.base.Target`
    (``target``: the target name its record gives; dpdk when none), to ask or to stop it."""
    from embnic.control.targets.base import get_target_class

    return get_target_class(target if isinstance(target, str) else "dpdk")(None, name=name, run_dir=rdir)


_ROLE_ORDER = {"card": 0, "server": 1, "impair": 2}


def node_label(rec: dict) -> str:
    """How a process record is named to users: ``the card``, ``shard 1's server``, ``the netem
    helper of link c1``."""
    role, node = rec.get("role"), str(rec.get("node"))
    if role == "card":
        return "the card"
    if role == "server" and node.startswith("s"):
        return f"shard {node[1:]}'s server"
    if role == "impair":
        return f"the netem helper of link {node}"
    return f"{node} ({role})"


def dead_nodes(state: dict) -> list[dict]:
    """The recorded card, server and netem-helper processes of a testbed state that no longer
    run (pid gone, or recycled: start time differs), card first.

    Returns:
        ``[{"node", "role", "pid", "log", "what"}]`` (``what``: :func:`node_label`).
    """
    out = []
    if not state.get("card") and state.get("name") and state.get("dir"):
        # no card of its own (up --no-card): the one `pipeline load` started from its config, if any
        st = loaded_card(state["name"], Path(state["dir"]).parent)
        if st is not None and not st.get("corrupt") and not pid_matches(st):
            out.append({"node": "card", "role": "card", "pid": st.get("pid"), "log": st.get("log"),
                        "what": f"the card (pipeline {card_pipeline_name(state['name'])}, from `pipeline load`)"})
    for rec in state.get("procs", []) or []:
        if rec.get("role") in _ROLE_ORDER and not pid_matches(rec):
            out.append({"node": rec.get("node"), "role": rec.get("role"), "pid": rec.get("pid"),
                        "log": rec.get("log"), "what": node_label(rec)})
    return sorted(out, key=lambda d: (_ROLE_ORDER[d["role"]], str(d["node"])))


def describe_dead(dead: list[dict]) -> str:
    """``the card, pid 123, is not running: see /run/embnic/testbed-emb/card.log`` (``; ``-joined
    for several), or ``""`` if none."""
    return "; ".join(f"{d['what']}, pid {d['pid']}, is not running: see {d['log']}" for d in dead)

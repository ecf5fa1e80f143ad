"""A card start that fails leaves nothing behind (CardProcess.start, control/targets/dpdk/process.py).

Each way embnic-dp can fail to start — a bad argument of its own (exit 2 before the EAL), an EAL
that cannot probe a vdev, a bad layout found after the EAL came up (exit 2), a control socket it
cannot serve (after ports and mempool), a port refused for the MTU, a card that does not answer in
time (stopped) — and afterwards: no process with its file prefix, no EAL runtime directory
(/var/run/dpdk/PREFIX), no control socket, no temporary directory or file of it in /tmp, nothing
of it in /dev/shm; the error still says why (the reason, and the log's last lines when the log
was a temporary file).
Run alone: sudo python3 -m pytest -q tests/dataplane/test_start_failure.py
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from embnic.control.targets.dpdk.process import DPDK_RUNTIME_DIR, CardProcess, DpdkProcError

pytestmark = [pytest.mark.dataplane, pytest.mark.root]

NULL = "net_null0,no-rx=1"

#: (vdevs, lcores, card args, ready timeout, words the error must hold)
CASES = {
    "bad_card_argument": ([NULL], "0", ["--burst", "0"], 30.0, ["bad value for --burst"]),
    "eal_cannot_probe": (["net_bogus0"], "0", [], 30.0, ["net_bogus0"]),
    "layout_after_eal": ([NULL], "0", ["--state-lcores", "2"], 30.0, ["exited with code 2"]),
    "ctl_not_servable": ([NULL], "0", ["--ctl", "/proc/version/card.sock"], 30.0,
                         ["cannot serve the control socket"]),
    "no_answer_in_time": ([NULL], "0", [], 0.05, ["did not answer"]),
}


def _leftovers(card: CardProcess) -> list[str]:
    """Everything of this card that is still there: processes, runtime dir, socket, temp files."""
    prefix = card.process.prefix
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if prefix.encode() in cmd:
            argv = cmd.replace(b"\0", b" ").decode(errors="replace")
            out.append(f"process {pid}: {argv[:120]}")
    if (DPDK_RUNTIME_DIR / prefix).exists():
        out.append(f"runtime dir {DPDK_RUNTIME_DIR / prefix}")
    for p in (card.ctl_path, card._sockdir, card.log_path):
        if Path(p).exists():
            out.append(f"file {p}")
    for d in ("/tmp", "/dev/shm"):
        out += [f"{d}/{n}" for n in os.listdir(d) if prefix in n]
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_failed_start_leaves_nothing_behind(card_bin, case):
    vdevs, lcores, args, timeout, words = CASES[case]
    card = CardProcess(card_bin, vdevs, lcores=lcores, args=args, ready_timeout=timeout)
    with pytest.raises(DpdkProcError) as e:
        card.start()
    msg = str(e.value)
    for w in words:
        assert w in msg, (w, msg)
    assert str(card.log_path) not in msg and "log" in msg  # the removed log is quoted, not pointed at
    assert _leftovers(card) == []
    assert card.returncode is not None or case == "no_answer_in_time"
    card.cleanup()  # harmless after a failed start
    assert _leftovers(card) == []


def test_failed_start_keeps_a_log_the_caller_gave(card_bin, tmp_path):
    """The caller's own log is theirs: kept, and named in the error."""
    log = tmp_path / "card.log"
    card = CardProcess(card_bin, [NULL], args=["--burst", "0"], log=log)
    with pytest.raises(DpdkProcError) as e:
        card.start()
    assert f"full log: {log}" in str(e.value) and "bad value for --burst" in log.read_text()
    assert [x for x in _leftovers(card) if not x.endswith(str(log))] == []

"""Control-socket errors blame the right thing: not a socket, connection limit vs. exited card.

Run alone: python3 -m pytest -q tests/control/test_ctlsock.py
"""
from __future__ import annotations

import json
import os
import socket
import threading
from pathlib import Path

import pytest

from embnic.control.ctlsock import CtlClient, CtlClosed, CtlNotLoaded
from embnic.control.runstate import proc_starttime

REPO = Path(__file__).resolve().parents[2]


class ClosingCard:
    """Accepts every connection and closes it at once, like embnic-dp with all 16 connection slots taken."""

    def __init__(self, path: str):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(8)
        self.accepted = 0
        self._t = threading.Thread(target=self._serve, daemon=True)
        self._t.start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self):
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self._t.join(5)


@pytest.fixture
def closing(env):
    c = ClosingCard(str(env / "embnic.sock"))
    yield c
    c.close()


def _state(env, pid, ctl):
    st = {"target": "dpdk", "name": "embnic", "pid": pid, "starttime": proc_starttime(pid) if pid > 0 else None,
          "ctl": ctl, "log": str(env / "embnic.log")}
    (env / "embnic.json").write_text(json.dumps(st))
    return st


def test_closed_by_a_running_card_says_so(invoke, env, closing):
    """A card that runs and closed without answering is not called exited. (At its connection
    limit the card itself answers with a JSON error or makes room: tests/dataplane/test_ctl_socket.py.)"""
    _state(env, os.getpid(), closing.path)  # the serving process: alive
    r = invoke("status")
    assert r.exit_code == 1
    out = r.output.strip()
    assert f"although it runs (pid {os.getpid()}): retry" in out and str(env / "embnic.log") in out
    assert "exit" not in out and len(out.splitlines()) == 1
    assert closing.accepted >= 1


def test_closed_by_an_exited_card_says_it_exited(invoke, env, closing):
    _state(env, 2**22 + 11, closing.path)  # no such pid
    r = invoke("route", "list")
    assert r.exit_code == 1
    assert f"the card (pid {2**22 + 11}) has exited; see {env / 'embnic.log'}" in r.output
    assert "pipeline unload" in r.output


def test_closed_without_a_state_file_names_both_causes(env, closing):
    with pytest.raises(CtlClosed) as e:
        CtlClient(closing.path, timeout=2).call("ping")
    msg = e.value.message
    assert "check that embnic-dp still runs (`embnic pipeline status`) and retry" in msg


def test_state_file_of_another_socket_is_not_trusted(invoke, env, closing, tmp_path):
    """--ctl names a socket the state file does not: its pid says nothing about who serves it."""
    _state(env, 2**22 + 11, str(tmp_path / "other.sock"))
    r = invoke("status", "--ctl", closing.path)
    assert r.exit_code == 1 and "has exited" not in r.output and "still runs" in r.output


@pytest.mark.parametrize("what", ["file", "dir"])
def test_ctl_that_is_not_a_socket(invoke, env, tmp_path, what):
    """--ctl README.md was reported as a "stale socket"."""
    path = REPO / "README.md" if what == "file" else tmp_path
    r = invoke("status", "--ctl", path)
    assert r.exit_code == 1
    kind = "a regular file" if what == "file" else "a directory"
    assert f"{path} is not a socket ({kind}): give the card's control socket with --ctl" in r.output
    assert "stale" not in r.output
    with pytest.raises(CtlNotLoaded, match="is not a socket"):
        CtlClient(path).call("ping")


def test_stale_socket_still_says_stale(env):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(env / "x.sock"))
    s.close()
    with pytest.raises(CtlNotLoaded, match=r"nothing answers on .*x\.sock \(stale socket\)"):
        CtlClient(env / "x.sock").call("ping")

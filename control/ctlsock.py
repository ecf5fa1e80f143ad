"""Client of the card's control socket: JSON lines over a UNIX stream socket.

Protocol (docs/control-socket.md): one JSON object per line each way; every request has
``"cmd"``, every response ``"ok"`` and, when false, ``"error"``. One connection per request
(connect, send one line, read one line, close), so several tools (the CLI, the testbed, a
``status --watch``) can talk to the same card in turn.

Example::

    from embnic.control.ctlsock import CtlClient
    ctl = CtlClient("/run/embnic/embnic.sock")
    ctl.call("ping")                       # {'ok': True, 'pid': 4242}
    ctl.call("route_add", shard=0, port=1, mac="02:00:00:00:01:01", ip="10.0.1.2", udp_port=7878)
"""
from __future__ import annotations

import errno
import json
import os
import socket
import stat
import time
from typing import Any

from embnic.control.errors import NEEDS_ROOT, USAGE, NeedsRootError, OperationalError
from embnic.control.runstate import pid_matches

#: largest response accepted (bytes); a state dump of 100k entries is ~20 MB
MAX_RESPONSE = 256 << 20
#: connections embnic-dp serves at a time (dataplane/include/embnic_conn.h EMBNIC_CONN_MAX): a new one takes the
#: slot of the one idle longest, or, when every one is busy, is refused with a one-line JSON error
MAX_CONNECTIONS = 16


class CtlError(OperationalError):
    """Base of control-socket failures (exit code 1)."""


class CtlNotLoaded(CtlError):
    """No card behind the socket: the path is absent or nobody accepts on it."""


class CtlPermission(NeedsRootError, CtlError):
    """The socket exists but this user may not connect (it is created mode 0600 by root): exit 2."""

    category = NEEDS_ROOT


class CtlTimeout(CtlError):
    """The card accepted but did not answer in time."""


class CtlProtocolError(CtlError):
    """The card answered something that is not one JSON object with ``ok``."""


class CtlClosed(CtlProtocolError):
    """The card accepted the connection and closed it without answering (it exited, or is stuck)."""


class CtlCommandError(CtlError):
    """The card answered ``{"ok": false, "error": ...}``; ``card_error`` holds its text.

    A well-formed request the card could not carry out (``"kind": "failure"``: a full table,
    no memory): operational, exit 1.
    """

    def __init__(self, message: str, cmd: str, card_error: str):
        super().__init__(message)
        self.cmd = cmd
        self.card_error = card_error


class CtlArgumentError(CtlCommandError):
    """The card refused the request itself (``"kind": "argument"``: a missing or malformed
    field, a value out of range such as a port the card lacks, an absent entry): a usage
    error, exit 2."""

    category = USAGE


class CtlClient:
    """Talks to one card's control socket at ``path``.

    Args:
        path: filesystem path of the UNIX socket (reachable from any network namespace).
        timeout: seconds to wait for each response.
        load_hint: the command line to suggest when no card answers.
        owner: the state file of the pipeline serving ``path`` (``pid``, ``starttime``, ``log``), if
            known: errors then say whether that process still runs.
        gone: when the socket's owner is known to be gone (a torn-down testbed), what to say instead of
            ``load_hint`` when there is no socket.
    """

    def __init__(self, path: str | os.PathLike, timeout: float = 5.0,
                 load_hint: str = "embnic pipeline load --config FILE", owner: dict | None = None,
                 gone: str | None = None):
        self.path = os.fspath(path)
        self.gone = gone
        self.timeout = float(timeout)
        self.load_hint = load_hint
        self.owner = owner if isinstance(owner, dict) and isinstance(owner.get("pid"), int) else None

    def _not_a_socket(self) -> str | None:
        """``"is a regular file"`` (etc.) when ``path`` exists but is no socket; None otherwise."""
        try:
            mode = os.stat(self.path).st_mode
        except OSError:
            return None
        if stat.S_ISSOCK(mode):
            return None
        kind = "a regular file" if stat.S_ISREG(mode) else "a directory" if stat.S_ISDIR(mode) else "not a socket"
        return (f"{self.path} is not a socket ({kind}): give the card's control socket with --ctl "
                "(default: from the pipeline's state file, else RUN_DIR/NAME.sock)")

    def _closed(self, cmd: str) -> CtlClosed:
        """The error for a connection the card closed without answering ``cmd``."""
        what = f"the card closed the control connection without answering `{cmd}`"
        if self.owner is not None:
            pid, log = self.owner["pid"], self.owner.get("log") or "its log"
            if pid_matches(self.owner):
                return CtlClosed(f"{what}, although it runs (pid {pid}): retry; if it keeps doing so, see its "
                                 f"log {log}")
            return CtlClosed(f"{what}: the card (pid {pid}) has exited; see {log}, then "
                             "`embnic pipeline unload` removes its stale state")
        return CtlClosed(f"{what}: check that embnic-dp still runs (`embnic pipeline status`) and retry")

    def __repr__(self) -> str:
        return f"CtlClient({self.path!r})"

    def _connect(self) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self.path)
        except FileNotFoundError:
            s.close()
            if self.gone:
                raise CtlNotLoaded(f"pipeline not loaded: no control socket at {self.path}; {self.gone}") from None
            raise CtlNotLoaded(f"pipeline not loaded: no control socket at {self.path}; "
                               f"run `{self.load_hint}` (or pass --ctl PATH; a testbed's card: "
                               "-c RUN_DIR/testbed-NAME/cluster.toml, as `embnic testbed up` prints)") from None
        except ConnectionRefusedError:
            s.close()
            bad = self._not_a_socket()
            if bad:
                raise CtlNotLoaded(bad) from None
            raise CtlNotLoaded(f"pipeline not loaded: nothing answers on {self.path} (stale socket); "
                               f"run `{self.load_hint}`") from None
        except PermissionError:
            s.close()
            raise CtlPermission(f"permission denied on control socket {self.path}: run as root "
                                "(sudo embnic ...)") from None
        except socket.timeout:
            s.close()
            raise CtlTimeout(f"control socket {self.path} did not accept within {self.timeout:g}s: "
                             "is embnic-dp stuck? see its log") from None
        except OSError as e:
            s.close()
            bad = self._not_a_socket()
            if bad:
                raise CtlNotLoaded(bad) from None
            if e.errno in (errno.ENOTSOCK, errno.ECONNREFUSED, errno.ENOENT):
                raise CtlNotLoaded(f"pipeline not loaded: {self.path} is not a live socket; "
                                   f"run `{self.load_hint}`") from None
            raise CtlError(f"cannot connect to control socket {self.path}: {e.strerror}") from None
        return s

    def call(self, cmd: str, **fields: Any) -> dict:
        """Send ``{"cmd": cmd, **fields}`` and return the card's response object.

        Returns:
            the response dict (``ok`` is True).
        Raises:
            CtlNotLoaded: no socket / nobody listening ("pipeline not loaded: run ...").
            CtlPermission: not allowed to connect (run as root; exit code 2).
            CtlClosed: the card closed the connection without answering (connection limit, or it exited).
            CtlTimeout: no complete response within ``timeout`` seconds.
            CtlProtocolError: the response is not one JSON object with ``ok``.
            CtlCommandError: the card answered ``ok: false`` (its ``error`` text is kept);
                :class:`CtlArgumentError` when its ``kind`` is ``"argument"``.
        """
        req = json.dumps({"cmd": cmd, **fields}, separators=(",", ":")).encode() + b"\n"
        s = self._connect()
        try:
            try:
                try:
                    s.sendall(req)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # closed at once: the one line it said first (all connections busy) is still there
                line = self._read_line(s, cmd)
            except socket.timeout:
                raise CtlTimeout(f"control socket {self.path} did not answer `{cmd}` within "
                                 f"{self.timeout:g}s: is embnic-dp stuck? see its log") from None
            except (BrokenPipeError, ConnectionResetError):
                raise self._closed(cmd) from None
        finally:
            s.close()
        try:
            resp = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise CtlProtocolError(f"card answered `{cmd}` with something that is not JSON: "
                                   f"{line[:80]!r}") from None
        if not isinstance(resp, dict) or "ok" not in resp:
            raise CtlProtocolError(f"card answered `{cmd}` without an \"ok\" field: {line[:80]!r}")
        if not resp["ok"]:
            err = str(resp.get("error") or "no reason given")
            cls = CtlArgumentError if resp.get("kind") == "argument" else CtlCommandError
            raise cls(f"card refused {cmd}: {err}", cmd, err)
        return resp

    def _read_line(self, s: socket.socket, cmd: str) -> bytes:
        buf = bytearray()
        deadline = time.monotonic() + self.timeout
        while True:
            i = buf.find(b"\n")
            if i >= 0:
                return bytes(buf[:i])
            s.settimeout(max(0.001, deadline - time.monotonic()))
            chunk = s.recv(1 << 16)
            if not chunk:
                if buf.strip():
                    return bytes(buf)  # tolerate a last line without newline
                raise self._closed(cmd)
            buf += chunk
            if len(buf) > MAX_RESPONSE:
                raise CtlProtocolError(f"response to `{cmd}` exceeds {MAX_RESPONSE} bytes")

    def ping(self) -> int:
        """Return the card's pid; raises like :meth:`call`."""
        return int(self.call("ping").get("pid", 0))

    def alive(self) -> bool:
        """True if the card answers ``ping`` (no exception)."""
        try:
            self.call("ping")
            return True
        except CtlError:
            return False

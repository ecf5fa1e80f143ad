"""A stand-in for embnic-dp's control socket (docs/control-socket.md), for CLI tests without DPDK.

In-process: ``FakeCard(path).start()`` serves the JSON-lines protocol on a thread, keeps routes
and clients in dicts, and records every request in ``.requests``.

As a program (what the test's fake ``embnic-dp`` ELF wrapper execs)::

    python3 ctl_fake_card.py [EAL args] -- --ctl PATH [--port-ip P=IP ...] [--ring-size N] ...

it parses the card's command line like the real one, serves until SIGTERM/SIGINT, removes its
socket and exits 0. ``--vdev`` EAL args become its ports.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import sys
import threading

_TOP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
#: the card's headers: its own (dataplane/include) and the protocol's (include/, shared with the libraries)
_DP_INCLUDES = (os.path.join(_TOP, "dataplane", "include"), os.path.join(_TOP, "include"))
_X_ENTRY = re.compile(r"X\(\s*([A-Z0-9_]+)\s*,\s*([a-z0-9_]+)\s*\)")


def card_drop_reasons(include_dirs: tuple[str, ...] = _DP_INCLUDES) -> tuple[str, ...]:
    """The drop reasons of the real card, in order: the names of the ``EMBNIC_DROP_REASONS(X)``
    X-macro in the card's headers (``dataplane/include/*.h``, ``include/*.h``: the card's one definition; the fake has no list of
    its own, so a reason added to the card is on the fake's ``counters`` too).

    Raises:
        RuntimeError: no header defines the X-macro, or it has no entries.
    """
    for path in sorted(os.path.join(d, n) for d in include_dirs for n in os.listdir(d) if n.endswith(".h")):
        with open(path) as f:
            lines = f.read().splitlines()
        for i, ln in enumerate(lines):
            if re.match(r"\s*#\s*define\s+EMBNIC_DROP_REASONS\s*\(\s*X\s*\)", ln):
                body = []
                while lines[i].rstrip().endswith("\\") and i + 1 < len(lines):
                    i += 1
                    body.append(lines[i])
                reasons = tuple(m.group(2) for m in _X_ENTRY.finditer("\n".join(body)))
                if not reasons:
                    raise RuntimeError(f"{path}: EMBNIC_DROP_REASONS(X) has no X(ENUM, name) entries")
                return reasons
    raise RuntimeError(f"no EMBNIC_DROP_REASONS(X) X-macro in {[os.path.abspath(d) for d in include_dirs]}")


DROP_REASONS = card_drop_reasons()
TYPES = ("LOOKUP_REQ", "LOOKUP_REPLY", "UPDATE_REQ", "UPDATE_ACK", "ERROR", "SIZE_REQ", "SIZE_ACK", "UPDATE_NACK")


class FakeCard:
    def __init__(self, path: str, ports=None, ring_size: int = 4096, state_size: int = 65536):
        self.path = path
        self.ports = ports if ports is not None else [
            {"port": 0, "name": "net_ring0", "mac": "02:00:00:00:00:10", "ip": "10.0.0.1"},
            {"port": 1, "name": "net_ring1", "mac": "02:00:00:00:00:11", "ip": "10.0.1.1"},
            {"port": 2, "name": "net_ring2", "mac": "02:00:00:00:00:12", "ip": "10.0.2.1"},
        ]
        self.ring_size = ring_size
        self.state_size = state_size
        self.routes: dict[int, dict] = {}
        self.table_size: int | None = None  #: set to make route_add fail ("kind": "failure") when full
        self.clients: dict[int, dict] = {}
        self.requests: list[dict] = []
        self.drops = {r: 0 for r in DROP_REASONS}
        self.drops["unknown_shard"] = 3
        self.drops["bad_magic"] = 1
        self.entries = [
            {"client": 1, "msg_id": 7, "state": "replying", "shard": 0, "type": "LOOKUP_REQ",
             "num_tables": 2, "num_keys": 360, "value_len": 2880, "msg_len": 2912,
             "frames_in": 2, "bytes_in": 2900, "frames_out": 2, "bytes_out": 2900, "first_ns": 1000, "last_ns": 51000,
             "frags_in": 2, "frag_count": 2},
            {"client": 2, "msg_id": 9, "state": "forwarded", "shard": 1, "type": "UPDATE_REQ",
             "num_tables": 1, "num_keys": 8, "value_len": 220, "msg_len": 300,
             "frames_in": 1, "bytes_in": 300, "frames_out": 1, "bytes_out": 300, "first_ns": 2000, "last_ns": 3000,
             "frags_in": 1, "frag_count": 1},
        ]
        self.paused = False
        self.quit: threading.Event | None = None
        self._stop = threading.Event()
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None

    # -- protocol
    def handle(self, req: dict) -> dict:
        self.requests.append(req)
        cmd = req.get("cmd")
        fn = getattr(self, f"do_{cmd}", None)
        # refusals say their kind as the card's do: "argument" (the request is wrong) or "failure"
        if fn is None:
            return {"ok": False, "error": f"unknown command {cmd!r}", "kind": "argument"}
        try:
            return {"ok": True, **(fn(req) or {})}
        except KeyError as e:
            return {"ok": False, "error": f"missing field {e}", "kind": "argument"}
        except LookupError as e:
            return {"ok": False, "error": str(e), "kind": "argument"}
        except MemoryError as e:
            return {"ok": False, "error": str(e), "kind": "failure"}

    def do_ping(self, req):
        return {"pid": os.getpid()}

    def do_info(self, req):
        return {"build": {"proto_version": 2, "hdr_len": 44, "git_rev": "fake"}, "ports": self.ports,
                "lcores": 2, "mode": "pipeline", "paused": self.paused}

    def do_pause(self, req):
        self.paused = True

    def do_resume(self, req):
        self.paused = False

    def do_quit(self, req):
        if self.quit is not None:
            self.quit.set()

    def _entry(self, req, key):
        port = int(req["port"])
        if port not in {p["port"] for p in self.ports}:
            raise LookupError(f"field 'port' must be an integer 0..{len(self.ports) - 1}")  # as embnic-dp says
        return {key: int(req[key]), "port": port, "mac": req["mac"], "ip": req["ip"], "udp_port": int(req["udp_port"])}

    def do_route_add(self, req):
        if self.table_size is not None and int(req["shard"]) not in self.routes and len(self.routes) >= self.table_size:
            raise MemoryError(f"shard table is full ({self.table_size} entries)")
        self.routes[int(req["shard"])] = self._entry(req, "shard")

    def do_route_del(self, req):
        if self.routes.pop(int(req["shard"]), None) is None:
            raise LookupError(f"no route for shard {req['shard']}")

    def do_route_list(self, req):
        return {"routes": [self.routes[k] for k in sorted(self.routes)]}

    def do_client_add(self, req):
        self.clients[int(req["client"])] = self._entry(req, "client")

    def do_client_del(self, req):
        if self.clients.pop(int(req["client"]), None) is None:
            raise LookupError(f"no client {req['client']}")

    def do_client_list(self, req):
        return {"clients": [self.clients[k] for k in sorted(self.clients)]}

    def do_counters(self, req):
        # port 1 sends at most 1514-byte frames and dropped 2 longer ones (too_long_for_port)
        return {"ports": [{"port": p["port"], "rx_frames": 10 * (i + 1), "rx_bytes": 1000 * (i + 1),
                           "tx_frames": 9 * (i + 1), "tx_bytes": 900 * (i + 1), "too_long_for_port": 2 * i,
                           "max_frame": 1514 if i else 2016} for i, p in enumerate(self.ports)],
                "types": {t: i for i, t in enumerate(TYPES)}, "drops": dict(self.drops),
                "drops_by_port": [{"port": p["port"], **{r: n if i == 0 else 0 for r, n in self.drops.items()}}
                                  for i, p in enumerate(self.ports)],
                "ring": {"size": self.ring_size, "count": 5, "high_water": 1024},
                "mempool": {"size": 8191, "available": 8000, "in_use": 191},
                "state": {"entries": 2, "capacity": self.state_size, "overflow": 0, "expired": 4},
                "completed": {"LOOKUP_REPLY": 40, "UPDATE_ACK": 10, "ERROR": 0, "SIZE_ACK": 0, "UPDATE_NACK": 0},
                "shards": [{"shard": 0, "LOOKUP_REPLY": 40, "UPDATE_ACK": 10, "ERROR": 0, "expired": 4,
                            "latency_sum_ns": 50 * 150_000, "latency_hist": [0] * 7 + [10, 30, 10] + [0] * 14}]}

    def do_state_summary(self, req):
        return {"entries": 2, "capacity": self.state_size, "overflow": 0, "expired": 4,
                "by_state": {"receiving": 0, "forwarded": 1, "replying": 1}}

    def do_state_dump(self, req):
        return {"entries": self.entries[: int(req.get("limit", 1000))]}

    def do_ring_stats(self, req):
        return {"size": self.ring_size, "count": 5, "high_water": 1024}

    def do_ring_last(self, req):
        """The header log as embnic-dp answers it (docs/control-socket.md ``ring_last``): 2 forwarded
        entries, 1 waiting in the header ring."""
        last = req.get("last", 20)
        if not isinstance(last, int) or not 1 <= last <= 255:
            raise LookupError("field 'last' must be an integer 1..255")
        log = [dict(msg_type=2, flags=0, msg_id=7, client_id=1, shard_id=0, num_tables=2, table_id=0xFFFF,
                    num_keys=360, value_len=2880, msg_len=2880, frag_index=1, frag_count=3, frag_len=1428,
                    status=0, ingress_port=1, egress_port=0, time_us=51, time_ns=51000, lcore=1),
               dict(msg_type=1, flags=0, msg_id=7, client_id=1, shard_id=0, num_tables=2, table_id=0xFFFF,
                    num_keys=360, value_len=2880, msg_len=2912, frag_index=1, frag_count=3, frag_len=1428,
                    status=0, ingress_port=0, egress_port=1, time_us=1, time_ns=1000, lcore=1)]
        ring = [dict(msg_type=5, flags=0, msg_id=8, client_id=1, shard_id=0, num_tables=1, table_id=4,
                     num_keys=2, value_len=16, msg_len=0, frag_index=0, frag_count=1, frag_len=0, status=2,
                     ingress_port=0, time_us=60, time_ns=60000)]
        return {"in_ring": ring[:last], "in_ring_count": len(ring), "entries": log[:last], "log_size": 255,
                "logged": len(log), "ring_size": self.ring_size, "ring_count": len(ring)}

    def do_reset_counters(self, req):
        self.drops = {r: 0 for r in DROP_REASONS}

    # -- server
    def start(self) -> "FakeCard":
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(self.path)
        os.chmod(self.path, 0o600)
        self._sock.listen(8)
        self._sock.settimeout(0.1)
        self._thread = threading.Thread(target=self.serve, daemon=True)
        self._thread.start()
        return self

    def serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                f = conn.makefile("rwb")
                try:
                    for line in f:
                        try:
                            req = json.loads(line)
                            resp = self.handle(req) if isinstance(req, dict) else {"ok": False, "error": "not an object"}
                        except json.JSONDecodeError:
                            resp = {"ok": False, "error": "bad json"}
                        f.write(json.dumps(resp).encode() + b"\n")
                        f.flush()
                except OSError:
                    pass

    def stop(self) -> None:
        self._stop.set()
        if self._sock is not None:
            self._sock.close()
        if self._thread is not None:
            self._thread.join(5)
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def main(argv: list[str]) -> int:
    """Behave like embnic-dp: parse ``EAL -- card args``, serve until SIGTERM."""
    eal, card = (argv[: argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else ([], argv)
    # DPDK ports: the allow-listed PCI devices first (the EAL probes the PCI bus before vdevs), then the vdevs
    vdevs = ([eal[i + 1] for i, a in enumerate(eal) if a in ("-a", "--allow")]
             + [eal[i + 1] for i, a in enumerate(eal) if a == "--vdev"])
    opts: dict[str, list[str]] = {}
    i = 0
    while i < len(card):
        if i + 1 < len(card) and not card[i + 1].startswith("--"):
            opts.setdefault(card[i], []).append(card[i + 1])
            i += 2
        else:  # a flag (--paused)
            opts.setdefault(card[i], []).append("")
            i += 1
    ctl = opts["--ctl"][0]
    ips = dict(a.split("=", 1) for a in opts.get("--port-ip", []))
    ports = [{"port": i, "name": v.split(",")[0], "mac": f"02:00:00:00:00:{i:02x}", "ip": ips.get(str(i))}
             for i, v in enumerate(vdevs)]
    if os.environ.get("FAKE_CARD_RUNTIME_DIR") and "--file-prefix" in eal:
        # what the EAL does first: create its runtime dir RUNTIME/PREFIX (a failed start leaves it behind)
        rt = os.path.join(os.environ["FAKE_CARD_RUNTIME_DIR"], eal[eal.index("--file-prefix") + 1])
        os.makedirs(rt, exist_ok=True)
        open(os.path.join(rt, "config"), "w").close()
    if os.environ.get("FAKE_CARD_FAIL"):
        print("EAL: fake failure: " + os.environ["FAKE_CARD_FAIL"], flush=True)
        return 1
    if os.environ.get("FAKE_CARD_LOG"):  # replay a real failed start's output (tests/control/eal_logs/)
        with open(os.environ["FAKE_CARD_LOG"]) as f:
            sys.stdout.write("".join(ln for ln in f if not ln.startswith("# ")))
        return int(os.environ.get("FAKE_CARD_RC", "1"))
    print(f"fake embnic-dp: {len(ports)} ports, ctl {ctl}", flush=True)
    card_ = FakeCard(ctl, ports, ring_size=int(opts.get("--ring-size", ["4096"])[0]))
    card_.paused = "--paused" in opts
    card_.quit = done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    if os.environ.get("FAKE_CARD_IGNORE_TERM"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    card_.start()
    while not done.wait(0.1):
        pass
    card_.stop()
    print("fake embnic-dp: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

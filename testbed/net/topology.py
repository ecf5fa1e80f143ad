"""The namespace testbed: clients, the card and parameter-server shards on veth pairs: its readiness
probe, bring-up (:class:`Testbed`), teardown (:func:`down`, from the state file alone) and status.

How: docs/testbed.md, "Wiring, names and readiness".
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import select
import socket
import sys
import time
from pathlib import Path

from embnic.client_lib import codec
from embnic.client_lib.config import ClusterConfig, load_config, parse_config
from embnic.client_lib.consts import MsgType, Status
from embnic.control import netns
from embnic.control.runstate import ensure_run_dir, pid_matches, proc_starttime, remove_state, run_dir
from embnic.control.runstate import state_path as runstate_path
from embnic.control.targets.base import get_target_class
from embnic.control.targets.dpdk.process import remove_runtime_dir

from embnic.control.netns import Netns, NetnsError, exec_argv, in_netns, netns_exists, netns_list, netns_pids

from .procs import (NeedsRoot, TestbedError, card_pipeline_name, card_target, dead_nodes, describe_dead, list_testbeds,
                    loaded_card, log_tail, node_dir, require_net_admin, save_testbed_state, spawn_logged,
                    state_path, stop_process, testbed_state)
from .toml_writer import dump_toml
from .wiring import DEFAULT_PMD, PmdError, Topology, card_file_prefix, check_name, derived_mac, link_prefix

PROBE_MSG_ID_BASE = 0xFFFF0000  #: msg ids of readiness probes (training starts at 1)

#: this module's probe, bring-up, teardown and status, and what its callers use of the modules it is built on
__all__ = ["Testbed", "down", "status", "probe_key", "ask", "PmdError", "Topology", "check_name", "derived_mac",
           "link_prefix", "NeedsRoot", "TestbedError", "NetnsError", "in_netns", "netns_list", "require_net_admin",
           "describe_dead", "save_testbed_state", "state_path", "testbed_state"]


# --------------------------------------------------------------------------- probe
def probe_key(cfg: ClusterConfig, shard_id: int):
    """The (table, key, owned) a readiness probe of shard ``shard_id`` looks up.

    The first table (config order) with a key the shard owns among ids ``0 .. min(rows, 4096)-1``
    and the smallest such key: under the ``hash`` policy a shard of S owns one id in S, so
    4096 candidates miss with probability (1-1/S)^4096. ``owned`` is False only when the shard
    owns none of them (``table`` policy, no table on it): then table 0, key 0.

    Returns:
        (``TableConfig``, keys uint64 (1,), owned bool).
    """
    import numpy as np

    from embnic.client_lib.routing import shard_of

    for t in cfg.tables:
        cand = np.arange(min(t.rows, 4096) if t.rows is not None else 4096, dtype=np.uint64)
        hit = np.flatnonzero(shard_of(cfg, t.id, cand) == shard_id)
        if hit.size:
            return t, cand[hit[:1]], True
    return cfg.tables[0], np.zeros(1, dtype=np.uint64), False


def ask(sock: socket.socket, cfg: ClusterConfig, client_id: int, shard_id: int, msg_id: int, timeout_s: float,
        resend_s: float) -> tuple[float | None, codec.Header | None, int]:
    """Look :func:`probe_key`'s key of shard ``shard_id`` up from client ``client_id`` on ``sock``
    (through the card: :meth:`~embnic.client_lib.config.ClusterConfig.request_destination`), sent
    again every ``resend_s`` s until a reply to (``client_id``, ``msg_id``) comes or ``timeout_s`` s
    have passed.

    Returns:
        (round trip in s from the last send, the reply's header, sends), or (None, None, sends)
        without a reply.
    """
    t0, key, _ = probe_key(cfg, shard_id)
    frames = codec.encode_table_lookup(msg_id=msg_id, client_id=client_id, table_id=t0.id, shard_id=shard_id,
                                       dim=t0.dim, dtype=t0.wire_dtype, keys=key, mtu=cfg.mtu)
    dest = cfg.request_destination(client_id, shard_id)
    deadline = time.monotonic() + timeout_s
    sends = 0
    while time.monotonic() < deadline:
        sent = time.monotonic()
        for f in frames:
            sock.sendto(f, dest)
        sends += 1
        end = min(deadline, sent + resend_s)
        while (left := end - time.monotonic()) > 0:
            if not select.select([sock], [], [], left)[0]:
                break
            try:
                h = codec.parse_header(sock.recv(65536), expect="reply")
            except (BlockingIOError, codec.FrameError):
                continue
            if h.msg_id == msg_id and h.client_id == client_id:
                return time.monotonic() - sent, h, sends
    return None, None, sends


def status_name(status: int) -> str:
    """The name of a reply's status (``Status``), or its number when it is none of them."""
    try:
        return Status(status).name
    except ValueError:
        return str(status)


# --------------------------------------------------------------------------- runtime
class Testbed(contextlib.AbstractContextManager):
    """A testbed being brought up, used and torn down.

    Args:
        topo: the declaration (:meth:`Topology.from_config`).
        rdir: run directory (default :func:`run_dir`).

    Use as a context manager (``with Testbed(topo).up() as tb: ...``) or call :meth:`up` and
    :func:`down` yourself.
    """

    __test__ = False

    def __init__(self, topo: Topology, rdir: Path | None = None, target: str = "dpdk"):
        if target != "dpdk" and topo.pmd != DEFAULT_PMD:
            raise PmdError(f"--pmd {topo.pmd} is a DPDK PMD of the dpdk card; the {target} card reads the veths "
                           f"itself: drop --pmd, or use --target dpdk", option="--pmd")
        self.topo = topo
        #: the card's pipeline target: "dpdk" (embnic-dp), "bmv2" (the P4 program on simple_switch) or
        #: "p4dpdk" (the P4 program for PNA in DPDK's SWX pipeline, embnic-swx)
        self.target_name = target
        self.name = topo.name
        self.rdir = Path(rdir) if rdir else run_dir()
        self.dir = node_dir(self.name, self.rdir)
        self.config_path = self.dir / "cluster.toml"
        self.state: dict = {}
        self._log = None
        self.target = None  #: the card's Target (DpdkTarget, Bmv2Target) once it runs

    # -- paths and config
    def log_path(self, node: str) -> Path:
        """One log per node: ``RUN_DIR/testbed-NAME/<node>.log`` (``testbed`` for the testbed's own)."""
        return self.dir / f"{node}.log"

    @functools.cached_property
    def cfg(self) -> ClusterConfig:
        """The effective cluster config (every MAC filled in) every testbed process reads."""
        return load_config(self.config_path)

    def _save(self) -> None:
        save_testbed_state(self.state, self.rdir)

    def _tlog(self):
        if self._log is None:
            ensure_run_dir(self.dir)
            self._log = open(self.log_path("testbed"), "a")
        return self._log

    def __exit__(self, *exc) -> None:
        self.down()

    # -- up
    def up(self, *, servers: bool = True, card: bool = True, probe: bool = True,
           ready_timeout: float = 20.0, server_argv=None, owner: str | None = None) -> "Testbed":
        """Create namespaces and links, start the shards and the card, probe the path.

        Args:
            servers: start a shard (``python -m embnic.testbed.server``) in every shard namespace.
            card: start the card (``embnic-dp``) in the card namespace and program it.
            probe: check that every client reaches every shard through the card.
            ready_timeout: seconds each readiness probe may take.
            server_argv: ``f(shard_id, config_path, ip) -> argv`` instead of ``python -m embnic.testbed.server``
                (run in the shard's namespace; must bind the shard's UDP port to be ready).
            owner: the job that owns this testbed (``"demo"``, ...). A testbed of the same name
                and owner whose creating process is gone (a crashed run) is torn down first;
                any other existing testbed of this name is an error.

        Returns:
            self (a context manager that tears the testbed down).

        Raises:
            NeedsRoot: not root.
            TestbedError: already up, a command failed, a node did not become ready in time
                (the message names its log). The testbed is torn down again before raising.
        """
        require_net_admin(f"testbed up ({self.name})")
        if self.check_free(owner) == "stale":
            # left behind by a crashed run of the same job (demo, trace record, replay): remove it
            old = testbed_state(self.name, self.rdir) or {}
            self._tlog().write(f"removing testbed {self.name} left by {owner} pid {old.get('creator_pid')}\n")
            down(self.name, self.rdir)
            self.check_free(owner)  # what is left now must be free
        ensure_run_dir(self.dir)  # one line naming EMBNIC_RUN_DIR if it cannot be made
        for f in self.dir.glob("*.log"):
            f.unlink()
        raw = self.topo.effective_raw(self.dir, self.target_name)
        text = dump_toml(raw)
        parse_config(json.loads(json.dumps(raw)), self.config_path)  # validate before writing
        self.config_path.write_text("# written by `embnic testbed up` from "
                                    f"{self.topo.cfg.path or '<dict>'}: every MAC filled in, [control] for the card\n"
                                    + text)
        self.state = {
            "name": self.name, "phase": "starting",
            "config": os.path.abspath(self.topo.cfg.path) if self.topo.cfg.path else None,
            "effective_config": str(self.config_path), "dir": str(self.dir), "created": time.time(),
            "creator_pid": os.getpid(), "creator_starttime": proc_starttime(os.getpid()), "owner": owner,
            "netns": [], "links": [], "procs": [], "card": None, "netem": None,
            "pmd": self.topo.pmd if self.target_name == "dpdk" else None,
        }
        self._save()
        try:
            self._create()
            if servers:
                self._start_servers(ready_timeout, server_argv)
            if card:
                self._start_card(ready_timeout)
            if probe and card and servers:
                self.probe(timeout=ready_timeout)
            self.state["phase"] = "up"
            self._save()
        except BaseException:
            self._tlog().write("up failed; tearing down\n")
            self.down()
            raise
        return self

    def check_free(self, owner: str | None = None) -> str | None:
        """Check that :meth:`up` may use this testbed's name, changing nothing (jobs that bring a
        testbed up after slow work, the demo, call it first).

        Returns:
            None if the name is free (or only a dead testbed's state file is left, which ``up``
            overwrites), ``"stale"`` if a testbed of this name and ``owner`` was left by a run
            whose process is gone (``up`` tears it down first).

        Raises:
            TestbedError: a testbed of this name is up (namespaces or processes alive), or
                namespaces ``NAME-...`` exist without a recorded testbed.
        """
        old = testbed_state(self.name, self.rdir)
        if old is not None and owner is not None and old.get("owner") == owner and not pid_matches(
                {"pid": old.get("creator_pid"), "starttime": old.get("creator_starttime")}):
            return "stale"
        if old is not None:
            live = [ns for ns in old.get("netns", []) if netns_exists(ns)]
            procs = [p for p in old.get("procs", []) if pid_matches(p)]
            if live or procs:
                raise TestbedError(f"testbed {self.name!r} is already up ({len(live)} namespaces, {len(procs)} "
                                   f"processes; state {state_path(self.name, self.rdir)}): run `embnic testbed "
                                   f"down --name {self.name}` first, or pick another --name")
        clash = [ns for ns in netns_list() if ns.startswith(f"{self.name}-")]
        if clash:
            raise TestbedError(f"namespaces {', '.join(clash)} exist but no testbed {self.name!r} is recorded: "
                               f"remove them with `embnic testbed down --name {self.name}`")
        return None

    def _create(self) -> None:
        log = self._tlog()
        topo = self.topo
        mtu = int(topo.cfg.mtu)
        for node in topo.nodes:
            if node.netns in self.state["netns"]:  # a host of several clients/shards: one namespace
                continue
            self.state["netns"].append(node.netns)
            self._save()
            Netns.create(node.netns, log=log)  # loopback up, IPv6 off
        cns = Netns(topo.card_ns, log=log)

        def offload_off_up(ns: Netns, ifname: str) -> None:
            ns.offloads_off(ifname)  # checksum offloads (docs/testbed.md)
            ns.link_up(ifname)

        bridges = {}
        for lk in topo.links:
            if lk.bridge and lk.bridge not in bridges:
                # several hosts on card port lk.port: a bridge in the card namespace is their L2
                # segment; the card's DPDK interface is one more port of it (a veth whose other end
                # is on the bridge), everything at the cluster MTU
                bridges[lk.bridge] = lk
                br_end = f"{lk.port_if}b"
                cns.bridge(lk.bridge, mtu=mtu)
                cns.veth(lk.port_if, br_end, mac=lk.card_mac, mtu=mtu)
                for ifname in (lk.port_if, br_end):
                    offload_off_up(cns, ifname)
                cns.set_master(br_end, lk.bridge)
                cns.link_up(lk.bridge)
            self.state["links"].append({"port": lk.port, "card_if": lk.card_if, "peer_if": lk.peer_if,
                                        "peer_ns": lk.peer_ns, "peer": lk.peer, "members": list(lk.members),
                                        "bridge": lk.bridge})
            self._save()
            # each end made in its namespace: no veth ever appears in the root namespace
            cns.veth(lk.card_if, lk.peer_if, peer_ns=lk.peer_ns, mac=None if lk.bridge else lk.card_mac,
                     peer_mac=lk.peer_mac, mtu=mtu)
            peer = Netns(lk.peer_ns, log=log)
            for ns, ifname in ((cns, lk.card_if), (peer, lk.peer_if)):
                offload_off_up(ns, ifname)
            if lk.bridge:
                cns.set_master(lk.card_if, lk.bridge)
            peer.add_address(lk.peer_if, f"{lk.peer_ip}/{lk.prefix_len}")
            peer.neigh_permanent(lk.peer_if, lk.card_ip, lk.card_mac)
            peer.default_route(lk.peer_if, lk.card_ip)

    def _spawn(self, node: str, role: str, argv: list[str]) -> dict:
        """Start ``argv`` in its own session with output to the node's log; record it."""
        logp = self.log_path(node)
        proc = spawn_logged(argv, logp)
        rec = {"node": node, "role": role, "pid": proc.pid, "starttime": proc_starttime(proc.pid),
               "argv": argv, "log": str(logp)}
        self.state["procs"].append(rec)
        self._save()
        return {**rec, "_popen": proc}

    def _start_servers(self, timeout: float, server_argv) -> None:
        cfg = self.cfg
        started = []
        for s in cfg.shards:
            ns = self.topo.shard_ns(s.id)
            if server_argv is not None:
                cmd = list(server_argv(s.id, str(self.config_path), s.ip))
            else:
                cmd = [sys.executable, "-m", "embnic.testbed.server", "--shard", str(s.id),
                       "--config", str(self.config_path), "--bind", s.ip]
            started.append((s, self._spawn(f"s{s.id}", "server", exec_argv(ns, cmd))))
        for s, rec in started:
            self._wait_udp(rec, s.port, f"shard {s.id}", timeout)

    def _wait_udp(self, rec: dict, port: int, what: str, timeout: float) -> None:
        """Wait until process ``rec`` has a UDP socket bound to ``port`` (in its namespace)."""
        deadline = time.monotonic() + timeout
        want = f":{port:04X} "
        while True:
            proc = rec["_popen"]
            rc = proc.poll()
            if rc is not None:
                raise TestbedError(f"{what} exited with code {rc} while starting: {log_tail(rec['log'])} "
                                   f"(log: {rec['log']})")
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{rec['pid']}/net/udp").read_text().splitlines()[1:]:
                    if want in line.split()[1] + " ":
                        return
            if time.monotonic() > deadline:
                raise TestbedError(f"{what} did not bind UDP port {port} within {timeout:g} s; see its log "
                                   f"{rec['log']}")
            time.sleep(0.05)

    def _start_card(self, timeout: float) -> None:
        cfg = self.cfg
        ctl = cfg.raw["control"]
        kind = self.target_name if self.target_name in ("bmv2", "p4dpdk") else "dpdk"
        kw = {"netns": self.topo.card_ns, "vdevs": self.topo.vdevs(), "name": "card", "run_dir": self.dir}
        if kind == "dpdk":  # embnic-dp
            kw.update(binary=ctl.get("binary"), card_args=ctl.get("card_args", ()), ready_timeout=timeout)
        else:  # simple_switch in the card namespace (no address but loopback), on the card's veth ends;
            kw["ready_timeout"] = max(timeout, 60.0)  # or embnic-swx (its first lcore only)
        if kind != "bmv2":  # embnic-dp and embnic-swx: the C card's EAL arguments and vdevs
            kw.update(eal_args=ctl["eal_args"], ctl_path=ctl["ctl"])
        self.target = get_target_class(kind)(cfg, **kw)
        # record before starting so `down` finds it even if we crash inside load()
        self.state["card"] = {"run_dir": str(self.dir), "name": "card", "ctl": ctl["ctl"],
                              "log": str(self.dir / "card.log"), "target": self.target_name}
        self._save()
        try:
            st = self.target.load()
        except Exception as e:  # OperationalError, ConfigError, BuildInfoError
            why, log = str(getattr(e, "message", None) or e), str(self.dir / "card.log")
            # the card's own error usually names its log already ("full log: ..."): once is enough
            raise TestbedError(f"the card did not start: {why}" + ("" if log in why else f" (log: {log})")) from None
        self.state["card"].update({"pid": st.get("pid"), "starttime": st.get("starttime"),
                                   "log": st.get("log", self.state["card"]["log"])})
        self.state["procs"].append({"node": "card", "role": "card", "pid": st.get("pid"),
                                    "starttime": st.get("starttime"), "argv": st.get("argv"),
                                    "log": st.get("log")})
        self._save()

    # -- probe
    def probe(self, timeout: float = 10.0) -> dict:
        """Send a one-key lookup from every client to every shard through the card; wait for replies.

        Each shard is asked for a key it owns (:func:`probe_key`), so it answers ``LOOKUP_REPLY``
        and counts no error; only a shard that owns no key at all (the ``table`` policy with no
        table placed on it) may answer ``ERROR NOT_OWNER``.

        Returns:
            ``{"c1->s0": rtt_us, ...}``.

        Raises:
            TestbedError: a client got no reply in ``timeout`` s (names the card and shard logs),
                or a shard answered the probe with an ERROR it should not have sent.
        """
        cfg = self.cfg
        out = {}
        for c in cfg.clients:
            with in_netns(self.topo.client_ns(c.id)):
                sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            with sock:
                sock.bind((c.ip, c.port))
                for i, s in enumerate(cfg.shards):
                    t0, key, owned = probe_key(cfg, s.id)
                    got, h, _ = ask(sock, cfg, c.id, s.id, PROBE_MSG_ID_BASE + i, timeout, 0.5)
                    if got is not None and h.msg_type == MsgType.ERROR and (
                            owned or h.status != Status.NOT_OWNER):
                        raise TestbedError(
                            f"probe: shard {s.id} answered client {c.id}'s lookup of table {t0.id} key {int(key[0])} "
                            f"with ERROR {status_name(h.status)}; see {self.log_path(f's{s.id}')}")
                    if got is None:
                        raise TestbedError(
                            f"probe: client {c.id} got no reply from shard {s.id} through the card within "
                            f"{timeout:g} s; see {self.dir / 'card.log'}, {self.log_path(f's{s.id}')} and "
                            f"`embnic testbed status --name {self.name}` (card drops)")
                    out[f"c{c.id}->s{s.id}"] = round(got * 1e6, 1)
        self.state["probe_rtt_us"] = out
        self._save()
        return out

    # -- use
    def server_record(self, shard_id: int) -> dict:
        """The state record of shard ``shard_id``'s server process."""
        for p in self.state.get("procs", []):
            if p.get("role") == "server" and p.get("node") == f"s{shard_id}":
                return p
        raise KeyError(f"no server for shard {shard_id}")

    def kill_server(self, shard_id: int) -> None:
        """Kill shard ``shard_id``'s server with SIGKILL, no SIGTERM first (fault injection: a crash);
        wait until it is gone. It stays recorded; ``down`` copes."""
        stop_process(self.server_record(shard_id), term=False)

    def restart_server(self, shard_id: int, extra_args=(), timeout: float = 20.0) -> dict:
        """Start shard ``shard_id``'s server again with its recorded argv plus ``extra_args``
        (e.g. ``["--restore", DIR]`` after :meth:`kill_server`), in its namespace, logging to
        the same log; wait until it binds its UDP port. The dead process's record is replaced.

        Returns:
            the new process record.

        Raises:
            KeyError: no server for that shard. TestbedError: it is still running, or did not
                bind its port in ``timeout`` s (names its log).
        """
        old = self.server_record(shard_id)
        if pid_matches(old):
            raise TestbedError(f"shard {shard_id}'s server (pid {old['pid']}) is still running; kill it first")
        self.state["procs"].remove(old)
        rec = self._spawn(f"s{shard_id}", "server", list(old["argv"]) + [str(a) for a in extra_args])
        self._wait_udp(rec, self.cfg.shard(shard_id).port, f"shard {shard_id}", timeout)
        rec.pop("_popen", None)
        return rec

    def dead_nodes(self) -> list[dict]:
        """The card, servers and netem helpers of this testbed that no longer run (:func:`dead_nodes`)."""
        return dead_nodes(self.state)

    def why_no_answer(self, dead: list[dict] | None = None) -> str:
        """Which of the card and the shard servers are dead (pids, logs; ``dead``: as
        :meth:`dead_nodes` just found them), or that all still run: a client only knows that a
        shard did not answer, and through the card that is as likely a dead card."""
        dead = self.dead_nodes() if dead is None else dead
        return describe_dead(dead) if dead else f"the card and every shard still run; see the logs in {self.dir}"

    def down(self) -> dict:
        """Tear this testbed down (:func:`down`)."""
        if self._log is not None:
            self._log.close()
            self._log = None
        return down(self.name, self.rdir)


# --------------------------------------------------------------------------- teardown
def down(name: str, rdir: Path | None = None) -> dict:
    """Remove everything testbed ``name`` made, in reverse order of :meth:`Testbed.up`.

    Works from the state file alone (also after a crash): impairment helpers, the card (also
    one ``pipeline load`` started from the testbed's config: :func:`loaded_card`),
    the servers, any other process left in the testbed's namespaces (``ip netns pids``,
    never by name), the namespaces (which takes their veths along), then the state file.
    Namespaces matching ``NAME-{card,c<id>,s<id>}`` are removed even if unrecorded. Logs stay
    in ``RUN_DIR/testbed-NAME/``.

    Returns:
        ``{"processes": [...stopped...], "netns": [...removed...], "found": bool}``.

    Raises:
        NeedsRoot: not root.
    """
    require_net_admin(f"testbed down ({name})")
    rdir = Path(rdir) if rdir else run_dir()
    state = testbed_state(name, rdir) or {}
    stopped, removed = [], []
    procs = state.get("procs", []) if isinstance(state.get("procs"), list) else []
    order = {"impair": 0, "client": 1, "card": 2, "server": 3}
    # the card through its target (clean DPDK shutdown, removes its socket and state file)
    card = state.get("card")
    if isinstance(card, dict):
        with contextlib.suppress(Exception):  # fall back to the pid below
            t = card_target(card.get("target"), card.get("name", "card"),
                            card.get("run_dir", str(node_dir(name, rdir))))
            if t.state() is not None:
                t.unload()
                stopped.append("card")
    # a card started later from the testbed's config (`pipeline load -c .../cluster.toml` after
    # `up --no-card`): it runs in our card namespace, so it is ours to stop, with its state file
    ext = loaded_card(name, rdir)
    if ext is not None:
        pname = card_pipeline_name(name)
        try:
            if card_target(ext.get("target"), pname, rdir).unload().get("was_running"):
                stopped.append(f"card:{pname}:{ext.get('pid')}")
        except Exception:  # noqa: BLE001 - by its recorded pid, then drop its state file
            if not ext.get("corrupt") and stop_process(ext):
                stopped.append(f"card:{pname}:{ext.get('pid')}")
            remove_state(rdir, pname)
    for rec in sorted(reversed(procs), key=lambda r: order.get(r.get("role"), 9)):
        if stop_process(rec):
            stopped.append(f"{rec.get('node')}:{rec.get('role')}:{rec.get('pid')}")
    pat = re.compile(rf"^{re.escape(name)}-(card|c\d+|s\d+)$")
    nss = [ns for ns in state.get("netns", []) if isinstance(ns, str)]
    nss += [ns for ns in netns_list() if pat.match(ns) and ns not in nss]
    for ns in reversed(nss):
        if not netns_exists(ns):
            continue
        for pid in [p for p in netns_pids(ns) if p != os.getpid()]:  # never this process
            rec = {"pid": pid, "starttime": proc_starttime(pid), "pgid": False}
            if stop_process(rec, timeout=2.0):
                stopped.append(f"{ns}:{pid}")
    for ns in reversed(nss):
        with contextlib.suppress(netns.NetnsError):  # best effort: the rest still goes
            if netns.delete(ns):
                removed.append(ns)
    # veths live only inside the namespaces; a crashed `ip link add` cannot leave one in the
    # root namespace, but check anyway
    for lk in state.get("links", []):
        for ifname in (lk.get("card_if"), lk.get("peer_if")):
            if ifname and Path(f"/sys/class/net/{ifname}").exists():
                netns.ip("link", "del", ifname, check=False)
    for p in (state_path(name, rdir), node_dir(name, rdir) / "card.sock", node_dir(name, rdir) / "card.json"):
        p.unlink(missing_ok=True)
    # the card's DPDK runtime directory (its --file-prefix is ours), left behind if it was killed
    remove_runtime_dir(card_file_prefix(name))
    return {"found": bool(state) or bool(removed), "processes": stopped, "netns": removed}


# --------------------------------------------------------------------------- status
def status(name: str, rdir: Path | None = None, counters: bool = True) -> dict:
    """What runs in testbed ``name``: namespaces, links, processes (alive or not), netem, card counters.

    ``dead`` lists the card, servers and netem helpers that no longer run (:func:`dead_nodes`);
    ``healthy`` is False if any did or a namespace is missing. A dead card is not asked for
    counters (``card.running`` False). After ``up --no-card``, ``card`` is the card that
    ``embnic pipeline load -c RUN_DIR/testbed-NAME/cluster.toml`` started (pipeline ``NAME-card``:
    ``pipeline``, ``pid``, ``running``, counters), or None if none was loaded.

    Raises:
        NeedsRoot: not root.
        TestbedError: no such testbed.
    """
    require_net_admin(f"testbed status ({name})")
    rdir = Path(rdir) if rdir else run_dir()
    state = testbed_state(name, rdir)
    if state is None:
        have = list_testbeds(rdir)
        raise TestbedError(f"no testbed {name!r} (state {state_path(name, rdir)} absent); "
                           + (f"running: {', '.join(have)}" if have else "start one with `embnic testbed up "
                              "--config examples/testbed.toml`"))
    if state.get("corrupt"):
        raise TestbedError(f"testbed {name!r}: its state file {state_path(name, rdir)} is damaged; "
                           f"`embnic testbed down --name {name}` removes it, then `embnic testbed up` again")
    dead = dead_nodes(state)
    out = {"name": name, "phase": state.get("phase"), "pmd": state.get("pmd"), "config": state.get("config"),
           "effective_config": state.get("effective_config"), "dir": state.get("dir"),
           "netns": {ns: netns_exists(ns) for ns in state.get("netns", [])},
           "links": state.get("links", []),
           "processes": [{"node": p.get("node"), "role": p.get("role"), "pid": p.get("pid"),
                          "alive": pid_matches(p), "log": p.get("log")} for p in state.get("procs", [])],
           "netem": state.get("netem"), "probe_rtt_us": state.get("probe_rtt_us"),
           "dead": dead, "healthy": not dead and all(netns_exists(ns) for ns in state.get("netns", []))}
    card = state.get("card")
    if isinstance(card, dict) and any(d["role"] == "card" for d in dead):
        out["card"] = {"ctl": card.get("ctl"), "log": card.get("log"), "running": False,
                       "error": f"the card (pid {card.get('pid')}) is not running; see {card.get('log')}"}
    elif not card:
        # up --no-card: a card `pipeline load` started later from the testbed's config, if any
        ext = loaded_card(name, rdir)
        if ext is not None:
            pname = card_pipeline_name(name)
            out["card"] = {"pipeline": pname, "loaded_by": "pipeline load", "pid": ext.get("pid"),
                           "ctl": ext.get("ctl"), "log": ext.get("log"),
                           "state_file": str(runstate_path(rdir, pname)), "running": False}
            if ext.get("corrupt"):
                out["card"]["error"] = (f"the state file of pipeline {pname} is damaged; `embnic pipeline unload "
                                        f"--name {pname}` removes it")
            elif not pid_matches(ext):
                out["card"]["error"] = (f"the card (pipeline {pname}, pid {ext.get('pid')}, from `pipeline load`) is "
                                        f"not running; see {ext.get('log')}")
            else:
                out["card"]["running"] = True
                if counters:
                    out["card"].update(_card_counters(ext.get("target"), pname, rdir))
    elif counters and isinstance(card, dict):
        out["card"] = {"ctl": card.get("ctl"), "log": card.get("log"),
                       **_card_counters(card.get("target"), "card", card.get("run_dir"))}
    return out


def _card_counters(target: str | None, name: str, rdir) -> dict:
    """``drops`` (the non-zero ones), ``frames_by_type``, ``ring``, ``ports``, ``state`` of the card
    pipeline ``name`` in ``rdir``, or ``{"error": ...}`` if it does not answer."""
    try:
        c = card_target(target, name, rdir).counters()
        return {"drops": {k: v for k, v in c.get("drops", {}).items() if v}, "frames_by_type": c.get("types"),
                "ring": c.get("ring"), "ports": c.get("ports"), "state": c.get("state")}
    except Exception as e:  # noqa: BLE001 - status shows what it can
        return {"error": str(e)}

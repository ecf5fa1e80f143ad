"""The ``dpdk`` target: runs ``embnic-dp`` (dataplane/) as a process and drives its control socket.

:meth:`DpdkTarget.load` starts it ``--paused`` (EAL arguments:
:func:`embnic.control.targets.dpdk.process.eal_argv`, or ``eal_args``; a NIC by PCI address is
checked first, :mod:`embnic.control.targets.dpdk.pci`), programs the config's routes and clients,
then ``resume`` (docs/cli.md ``pipeline load``). The process and its control socket are a
:class:`DpdkCard`, the base of the ``p4dpdk`` target too.

    t = DpdkTarget(load_config("examples/testbed.toml"), vdevs=["net_af_packet0,iface=veth-c0"],
                   netns="enT42card", name="enT42")
    t.load(); print(t.counters()["drops"]); t.unload()
"""
from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import time
import zlib
from pathlib import Path
from typing import Any, Sequence

from embnic.client_lib.config import ClusterConfig, ConfigError, normalize_bdf, parse_lcores
from embnic.control import buildinfo
from embnic.control.ctlsock import CtlArgumentError, CtlClient, CtlCommandError, CtlError
from embnic.control.targets.dpdk.process import (REPO_BINARY, DpdkProcess, eal_argv, flag_each,
                                                 stop_recorded)
from embnic.control.errors import NoSuchEntryError, OperationalError, UsageError, split_args
from embnic.control.targets.dpdk.xdp import af_xdp_problem
from embnic.control.targets.dpdk.vdevs import vdevs_problem
from embnic.control.runstate import (ensure_run_dir, pid_matches, read_state, remove_state,
                                     require_netns, require_root, state_path, write_state)
from embnic.control.targets.base import Peer, Target, count_peers, describe_state, peer_kind, peers_from_config

def core_ranges(cores) -> str:
    """``[0, 1, 2, 5]`` → ``"0-2,5"`` (a DPDK core list)."""
    out = []
    for _, run in itertools.groupby(enumerate(sorted(set(cores))), lambda ic: ic[1] - ic[0]):
        run = [c for _, c in run]
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def lcores_problem(lcores: str) -> str | None:
    """Why the EAL would refuse the core list ``lcores`` on this machine, or None if it would not.

    Checks the syntax (:func:`~embnic.client_lib.config.parse_lcores`) and that every core is
    one this process may run on (``os.sched_getaffinity``; the card inherits it).
    """
    try:
        want = parse_lcores(lcores)
    except ValueError as e:
        return str(e)
    have = os.sched_getaffinity(0)
    missing = [c for c in want if c not in have]
    if missing:
        return (f"{lcores!r} names core(s) {core_ranges(missing)} but this machine has core(s) "
                f"{core_ranges(have)} (the EAL would refuse: 'lcore {missing[0]} unavailable'); "
                f"use e.g. lcores = \"{min(have)}\"")
    return None


def find_binary(binary: str | os.PathLike | None = None) -> Path:
    """The embnic-dp binary to run: ``binary``, else ``$EMBNIC_DP``, else the repo's
    dataplane/build/embnic-dp, else ``embnic-dp`` on PATH.

    Raises:
        BinaryArgumentError: ``binary`` or ``$EMBNIC_DP`` names no file (exit 2).
        OperationalError: nothing given and none of the defaults exists (names the build command).
    """
    for given, what, fix in ((binary, "no embnic-dp binary at {}", "give the right --binary"),
                             (os.environ.get("EMBNIC_DP"), "EMBNIC_DP={} does not exist", "fix EMBNIC_DP")):
        if given:
            if not Path(given).is_file():
                raise buildinfo.BinaryArgumentError(f"{what.format(Path(given))}: build it with `make -C dataplane` "
                                                    f"or {fix}")
            return Path(given)
    if REPO_BINARY.is_file():
        return REPO_BINARY
    on_path = shutil.which("embnic-dp")
    if on_path:
        return Path(on_path)
    raise OperationalError(f"no embnic-dp binary (looked at {REPO_BINARY} and PATH): build it with "
                           "`make -C dataplane` or pass --binary")



_LIST_FIX = "close the quote, or give a list of strings"


class DpdkCard(Target):
    """A target whose card program runs under DPDK's EAL behind its control socket (``embnic-dp``:
    ``dpdk``; ``embnic-swx``: ``p4dpdk``): the process runner and control-socket client both share.

    Args:
        config: cluster config; its ``[card]`` gives ports (``--port-ip``), ring/state sizes, lcores.
        binary: path of embnic-dp (default: see :func:`find_binary`).
        eal_args: EAL arguments replacing the defaults (list, or a string split like a shell).
        ctl_path: control socket path (default: the state file's, else ``RUN_DIR/NAME.sock``).
        netns: run the card inside this network namespace (``ip netns exec``; needs root).
        name: pipeline instance name (state file ``RUN_DIR/NAME.json``, log ``RUN_DIR/NAME.log``).
        run_dir: directory of state files, sockets and logs (:class:`Target`).
        vdevs: ``--vdev`` specs, one DPDK port each in this order (``net_ring0``, ``net_null0``,
            ``net_af_packet0,iface=veth0``, ...).
        lcores: EAL lcore list (default ``card.lcores`` of the config, else ``0,1``).
        ready_timeout: seconds to wait for the control socket to answer ``ping``.
        stop_timeout: seconds to wait after SIGTERM before SIGKILL.
        check_build: refuse a binary whose build info does not match (leave True).
        timeout: seconds to wait for each control-socket response.
        card_args: more card arguments after the generated ones (e.g. ``["--idle-us", "50"]``,
            ``["--burst", "16"]``; docs/control-socket.md).
        start_paused: start with ``--paused`` and send ``resume`` once routes and clients are
            programmed, so no frame is read (and dropped as unknown) before the tables are set.
        pci: PCI addresses of the NIC ports to run on (default ``card.pci`` of the config), DPDK
            ports 0.. in this order, before the vdevs.
        hugepages: EAL memory from hugepages (default: when there are PCI devices).
        sysfs_root: where sysfs is (default ``$EMBNIC_SYSFS_ROOT`` or ``/sys``; tests: a fake tree).
    """

    OPTIONS = frozenset({"binary", "eal_args", "ctl_path", "netns", "vdevs", "lcores", "ready_timeout",
                         "stop_timeout", "check_build", "timeout", "card_args", "start_paused", "pci", "hugepages",
                         "sysfs_root"})
    #: run on the first lcore of the card's list only (embnic-swx)
    ONE_LCORE = False

    def __init__(self, config: ClusterConfig | None = None, binary: str | os.PathLike | None = None,
                 eal_args: Sequence[str] | str | None = None, ctl_path: str | os.PathLike | None = None,
                 netns: str | None = None, *, name: str = "embnic", run_dir: str | os.PathLike | None = None,
                 vdevs: Sequence[str] = (), lcores: str | None = None, ready_timeout: float = 30.0,
                 stop_timeout: float = 10.0, check_build: bool = True, timeout: float = 5.0,
                 card_args: Sequence[str] | str = (), start_paused: bool = True, pci: Sequence[str] | None = None,
                 hugepages: bool | None = None, sysfs_root: str | os.PathLike | None = None):
        super().__init__(config, name=name, run_dir=run_dir)
        if pci is None:
            card = config.card if config is not None else None
            pci = card.pci if card is not None else ()
        try:
            self.pci = tuple(normalize_bdf(b) for b in pci)
        except ValueError as e:
            raise UsageError(f"--pci: {e}", param="pci") from None
        self.hugepages = bool(self.pci) if hugepages is None else bool(hugepages)
        self.sysfs_root = sysfs_root
        self.binary = binary
        if isinstance(eal_args, str):
            eal_args = split_args(eal_args, "eal_args", fix=_LIST_FIX)
        self.card_args = split_args(card_args, "card_args", fix=_LIST_FIX) if isinstance(card_args, str) else list(card_args or ())
        self.start_paused = bool(start_paused)
        self.eal_args = list(eal_args) if eal_args is not None else None
        self._ctl_path = os.fspath(ctl_path) if ctl_path else None
        self.netns = netns
        self.vdevs = tuple(vdevs or ())
        self.lcores = lcores
        self.ready_timeout = float(ready_timeout)
        self.stop_timeout = float(stop_timeout)
        self.check_build = check_build
        self.timeout = float(timeout)
        self.proc: DpdkProcess | None = None

    # ------------------------------------------------------------------ paths
    @property
    def start_ctl_path(self) -> str:
        """The control socket a card this target starts listens on: explicit, else ``RUN_DIR/NAME.sock``."""
        return self._ctl_path or str(self.run_dir / f"{self.instance}.sock")

    @property
    def ctl_path(self) -> str:
        """The control socket: explicit, else the state file's, else ``RUN_DIR/NAME.sock``."""
        st = None if self._ctl_path else read_state(self.run_dir, self.instance)
        return st["ctl"] if st and isinstance(st.get("ctl"), str) else self.start_ctl_path

    @property
    def file_prefix(self) -> str:
        """Default EAL ``--file-prefix``: ``embnic-NAME-<crc of RUN_DIR>``, unique per running instance
        (the state file allows one per name and run directory)."""
        return f"embnic-{self.instance}-{zlib.crc32(str(self.run_dir.resolve()).encode()) & 0xFFFFFF:06x}"

    def ctl(self, timeout: float | None = None) -> CtlClient:
        """A :class:`CtlClient` for this pipeline's control socket (knowing the pid that serves it,
        when the state file names this socket)."""
        hint = "embnic pipeline load --config FILE" + (f" --name {self.instance}" if self.instance != "embnic" else "")
        path = self.ctl_path
        tbdir = Path(path).parent
        if tbdir.name.startswith("testbed-") and read_state(tbdir.parent, tbdir.name) is None:
            # a testbed's card (its config copy and logs outlive `testbed down`): the fix is to bring
            # the testbed up again, not to load a pipeline by hand
            tb = tbdir.name[len("testbed-"):]
            gone = (f"testbed {tb} is down (its logs remain in {tbdir}): bring it up with "
                    f"`embnic testbed up -c CONFIG --name {tb}`")
        else:
            gone = None
        st = read_state(self.run_dir, self.instance)
        owner = st if st and not st.get("corrupt") and st.get("ctl") == path else None
        return CtlClient(path, timeout=self.timeout if timeout is None else timeout, load_hint=hint, owner=owner, gone=gone)

    def call(self, cmd: str, **fields: Any) -> dict:
        """One control command; the response without its ``ok``."""
        return {k: v for k, v in self.ctl().call(cmd, **fields).items() if k != "ok"}

    # ------------------------------------------------------------------ command line
    def eal_argv(self) -> list[str]:
        """EAL arguments: ``eal_args`` (then ``-a BDF`` per PCI device) or the defaults (``one_lcore``:
        the first lcore of the list), then one ``--vdev`` per vdev."""
        if self.eal_args is not None:
            return [*self.eal_args, *flag_each("-a", self.pci), *flag_each("--vdev", self.vdevs)]
        card = self.config.card if self.config is not None else None
        lcores = self.lcores or (card.lcores if card is not None else "0,1")
        if self.ONE_LCORE:
            lcores = re.split(r"[,-]", lcores)[0]
        return eal_argv(lcores, self.file_prefix, self.vdevs, pci=self.pci, hugepages=self.hugepages)

    # ------------------------------------------------------------------ lifecycle
    def check_config(self, program: bool) -> list[Peer]:
        """Check, before anything starts, what a load needs: the config and its ``[card]``, the DPDK
        ports (vdevs, PCI devices or EAL arguments) and lcores.

        Returns:
            the peers to program (``program``), else [].
        Raises:
            UsageError: no config, no ports, bad lcores or vdevs.
            ConfigError: no ``[card]``, or a shard/client without ``mac``/``card_port``.
            OperationalError: a PCI device or hugepages not ready (:mod:`embnic.control.targets.dpdk.pci`).
        """
        cfg = self.config
        if cfg is None:
            raise UsageError(f"loading the {self.name} target needs the cluster config: pass --config FILE",
                             param="config")
        if cfg.card is None or not cfg.card.enabled:
            raise ConfigError("card", f"the {self.name} target needs a [card] section (enabled = true) with its "
                              "ports; see docs/config.md and examples/testbed.toml", cfg.path)
        if self.eal_args is None and not self.vdevs and not self.pci:
            raise UsageError("no DPDK ports: give one --vdev per card port (e.g. --vdev net_ring0 "
                             "--vdev net_ring1), `vdevs` in [control] of the config, a NIC's --pci BDF "
                             "(or [card] pci), or --eal-args", param="vdevs")
        if self.eal_args is None:
            bad = lcores_problem(self.lcores or cfg.card.lcores)
            if bad:
                src = "--lcores" if self.lcores else f"card.lcores in {cfg.path or 'the config'}"
                raise UsageError(f"{src}: {bad}", param="lcores")
            if self.lcores and len(parse_lcores(self.lcores)) < cfg.card.state_lcores:
                raise UsageError(f"--lcores {self.lcores}: card.state_lcores = {cfg.card.state_lcores} in "
                                 f"{cfg.path or 'the config'} needs at least that many lcores", param="lcores")
            n = len(self.pci) + len(self.vdevs)
            for i, p in enumerate(cfg.card.ports):
                if p.id >= n:
                    what = f"{len(self.pci)} PCI device(s) and {len(self.vdevs)} vdev(s)" if self.pci else \
                        f"{len(self.vdevs)} vdev(s)"
                    raise UsageError(f"card.ports[{i}] is DPDK port {p.id} but only {what} given: give one "
                                     "--pci or --vdev per card port, in port order", param="vdevs")
        # malformed specs, a device twice, more ports than the card has: before the EAL sees them
        bad = vdevs_problem(self.vdevs, None if self.eal_args is not None else [p.id for p in cfg.card.ports],
                            len(self.pci))
        if bad:
            raise UsageError(bad, param="vdevs")
        # each PCI device there and bound to a driver DPDK can use, hugepages free: else the first fault
        if self.pci:
            from embnic.control.targets.dpdk import pci as P

            for bad in [*(P.pci_problem(b, self.sysfs_root) for b in self.pci),
                        P.hugepages_problem(self.sysfs_root) if self.hugepages and self.eal_args is None else None]:
                if bad:
                    raise OperationalError(bad)
        return peers_from_config(cfg) if program else []

    def claim(self) -> None:
        """Make sure nothing runs under this name before a load: the namespace exists, no
        ``net_af_xdp`` port's XDP hook is taken, the run directory exists and a stale state file
        (its process gone) is removed.

        Raises:
            UsageError: ``netns`` names no namespace.
            OperationalError: the pipeline already runs, or a net_af_xdp port's interface is
                missing or runs an XDP program (:func:`~embnic.control.targets.dpdk.xdp.af_xdp_problem`).
        """
        if self.netns:
            require_root("running the card in a network namespace (--netns)")
            require_netns(self.netns)
        bad = af_xdp_problem(self.vdevs, self.netns)  # its XDP hook taken: the PMD would fail deep in the log
        if bad:
            raise OperationalError(bad)
        ensure_run_dir(self.run_dir)
        old = read_state(self.run_dir, self.instance)
        if old is not None:
            if not old.get("corrupt") and pid_matches(old):
                raise OperationalError(f"pipeline {self.instance!r} is already running ({describe_state(old)}); "
                                       f"run `embnic pipeline unload --name {self.instance}` first, or load "
                                       "another one with --name")
            remove_state(self.run_dir, self.instance)  # stale: its process is gone

    def run(self, binary: str | os.PathLike, name: str, app: Sequence[str], state: dict,
            program) -> tuple[dict, dict]:
        """Start ``binary`` (``name`` in messages) with the EAL arguments and ``app`` (its arguments after ``--``, the
        control socket :attr:`start_ctl_path` among them), write the state file, wait until it
        answers ``ping`` and has a DPDK port per ``[[card.ports]]``, call ``program(info)`` (its
        tables), then ``resume`` it (``start_paused``). A failure stops it and removes the state file.

        Returns:
            ``(state, info)``: the state file's contents (``state`` plus the process's record) and
            the card's ``info``.
        Raises:
            OperationalError: a card already answers on the socket, it cannot start, is not
                ready in time or lacks a port; whatever ``program`` raises.
        """
        ctl = self.start_ctl_path
        if os.path.exists(ctl):
            try:
                pid = CtlClient(ctl, timeout=1.0).ping()
            except CtlError:
                os.unlink(ctl)  # stale socket of a card that died
            else:
                raise OperationalError(f"a card (pid {pid}) already answers on {ctl}: unload it "
                                       "(`embnic pipeline unload`) or choose another --ctl/--name")
        Path(ctl).parent.mkdir(parents=True, exist_ok=True)
        proc = DpdkProcess(binary, self.eal_argv(), app, netns=self.netns, log=self.log_path, name=name)
        self.proc = proc.start()
        state = {"target": self.name, "name": self.instance, **proc.record(), "ctl": ctl,
                 "binary": os.fspath(binary), "netns": self.netns,
                 "config": os.path.abspath(self.config.path) if self.config.path else None,
                 "started": time.time(), **state}
        write_state(self.run_dir, self.instance, state)
        try:
            proc.wait_answer(ctl, self.ready_timeout, "answer `ping`")
            info = self.call("info")
            have = {int(p["port"]) for p in info.get("ports", [])}
            for i, p in enumerate(self.config.card.ports):
                if p.id not in have:
                    raise OperationalError(f"card.ports[{i}] is DPDK port {p.id} but {name} has ports "
                                           f"{sorted(have)}: give one --vdev per card port")
            program(info)
            if self.start_paused:
                self.ctl().call("resume")
        except BaseException:
            proc.stop(self.stop_timeout)  # also removes the failed start's EAL runtime dir
            remove_state(self.run_dir, self.instance)
            raise
        return state, info

    def unload(self) -> dict:
        """Stop the card (SIGTERM, then SIGKILL after ``stop_timeout``), remove state file and socket.

        Returns:
            ``{pid, was_running, killed, exit, ctl, log}``.
        Raises:
            OperationalError: no state file for this name (nothing loaded).
        """
        st = read_state(self.run_dir, self.instance)
        if st is None:
            raise OperationalError(f"pipeline {self.instance!r} is not loaded (no {state_path(self.run_dir, self.instance)}); "
                                   "nothing to unload")
        if st.get("corrupt") or not isinstance(st.get("pid"), int):
            remove_state(self.run_dir, self.instance)
            return {"pid": None, "was_running": False, "killed": False, "exit": None, "ctl": None,
                    "log": None, "corrupt": True}
        res = stop_recorded(st, self.stop_timeout, child=self.proc.proc if self.proc is not None else None)
        remove_state(self.run_dir, self.instance)
        ctl = st.get("ctl")
        if ctl and os.path.exists(ctl) and not CtlClient(ctl, timeout=0.5).alive():
            with contextlib.suppress(OSError):
                os.unlink(ctl)
        return {**res, "ctl": ctl, "log": st.get("log")}

    def is_loaded(self) -> bool:
        """True if the state file's process runs and the control socket answers ``ping``."""
        st = read_state(self.run_dir, self.instance)
        if st is not None and not st.get("corrupt") and not pid_matches(st):
            return False
        return self.ctl(timeout=1.0).alive()


    @classmethod
    def from_settings(cls, s, **opts: Any) -> "Target":
        """Build from resolved CLI settings (``--binary``, ``--eal-args``, ``--vdev``, ``--netns``, ``--ctl``)."""
        return cls(s.config, binary=s.binary, eal_args=s.eal_args, ctl_path=s.ctl, netns=s.netns,
                   vdevs=s.vdevs, name=s.name, run_dir=s.run_dir, card_args=s.card_args,
                   **{k: v for k, v in opts.items() if v is not None})


class DpdkTarget(DpdkCard):
    """The embnic pipeline as the DPDK program ``embnic-dp``."""

    name = "dpdk"
    #: ``load`` refuses to run without root: the EAL needs it here (runtime dir, af_packet/tap vdevs).
    #: Tests of a stand-in binary (no EAL) set it False.
    NEEDS_ROOT = True

    def card_argv(self, ctl: str) -> list[str]:
        """Arguments after ``--``: control socket, port addresses, ring/state sizes from ``[card]``."""
        card = self.config.card
        args = ["--ctl", ctl, *flag_each("--port-ip", (f"{p.id}={p.ip}" for p in card.ports))]
        args += ["--ring-size", str(card.ring_size), "--state-size", str(card.state_size),
                 "--state-timeout-ms", str(card.state_timeout_ms)]
        if card.state_lcores > 1:  # the card's default is 1
            args += ["--state-lcores", str(card.state_lcores)]
        # the cluster MTU: mbufs that hold a whole frame of it, and every port must send one (the
        # card refuses at start a port whose frames are smaller, naming it: docs/control-socket.md)
        args += ["--mtu", str(self.config.mtu)]
        if self.start_paused:
            args.append("--paused")
        return args + self.card_args

    def argv(self, binary: str | os.PathLike, ctl: str) -> list[str]:
        """The whole command line, with ``ip netns exec NS`` in front when ``netns`` is set."""
        return DpdkProcess(binary, self.eal_argv(), self.card_argv(ctl), netns=self.netns,
                           log=self.log_path).argv

    # ------------------------------------------------------------------ lifecycle
    def load(self, program: bool = True) -> dict:
        """Start embnic-dp, wait until it answers, program routes and clients (see module doc).

        Returns:
            the state file contents plus ``routes``/``clients`` counts and the card's ``info``.
        Raises:
            UsageError: no config / no ports given, ``netns`` names no namespace (exit 2).
            NeedsRootError: not root (exit 2).
            ConfigError: no ``[card]``, or a shard/client without ``mac``/``card_port``.
            BuildInfoError: the binary's build info does not match the client library.
            OperationalError: already running, cannot start, not ready in time; a ``net_af_xdp``
                vdev whose interface is missing or already runs an XDP program
                (:func:`~embnic.control.targets.dpdk.xdp.af_xdp_problem`).
        """
        peers = self.check_config(program)
        if self.NEEDS_ROOT:
            require_root("loading the dpdk target (embnic-dp and its DPDK EAL)")
        self.claim()
        binary = find_binary(self.binary)
        bi = buildinfo.require_compatible(binary, udp_port=self.config.udp_port) if self.check_build else None
        build = {"proto_version": bi.proto_version, "git_rev": bi.git_rev} if bi else None

        def program_peers(info: dict) -> None:
            for p in peers:
                self.peer_add(p)

        state, info = self.run(binary, "embnic-dp", self.card_argv(self.start_ctl_path),
                                    {"build": build}, program_peers)
        return {**state, **count_peers(peers), "info": info, "warnings": self._port_mac_warnings(info)}

    def _port_mac_warnings(self, info: dict) -> list[str]:
        """One line per ``[card].ports`` entry whose ``mac`` differs from the DPDK port's real MAC.

        embnic-dp cannot set a port's MAC (docs/control-socket.md), so the config's ``mac`` is
        only a statement of what the port has; peers that were told the config's MAC would send
        to the wrong address.
        """
        real = {int(p["port"]): str(p.get("mac", "")).lower() for p in info.get("ports", []) if "port" in p}
        out = []
        for i, p in enumerate(self.config.card.ports):
            have = real.get(p.id)
            if p.mac and have and have != p.mac:
                out.append(f"card.ports[{i}].mac is {p.mac} but DPDK port {p.id} has {have}; embnic-dp cannot "
                           "set a port's MAC: give the port that MAC (for af_packet: `ip link set dev IF address "
                           f"{p.mac}`) or write mac = \"{have}\" in the config")
        return out

    # ------------------------------------------------------------------ tables
    def peer_add(self, p: Peer) -> None:
        """Add or replace peer ``p`` (``route_add`` or ``client_add`` on the control socket).

        Raises:
            UsageError: the card refused a field (``p.port`` not one of its ports; exit 2), named
                as the option, like the bmv2 target's.
            CtlCommandError: the card could not add it (its table is full; exit 1).
        """
        fields = p.fields()
        try:
            self.ctl().call(f"{p.spec.noun}_add", **fields)
        except CtlArgumentError as err:
            m = re.match(r"field '(\w+)'", err.card_error)
            if m and m.group(1) in fields:
                raise UsageError(f"--{m.group(1).replace('_', '-')} {fields[m.group(1)]}: {err}") from None
            raise

    def peer_del(self, kind: str, id_: int) -> None:
        k = peer_kind(kind)
        try:
            self.ctl().call(f"{k.noun}_del", **{kind: int(id_)})
        except CtlCommandError:  # the card refuses a well-formed del only when the entry is absent
            raise NoSuchEntryError(k.noun, id_) from None

    def peer_list(self, kind: str) -> list[Peer]:
        k = peer_kind(kind)
        got = self.ctl().call(f"{k.noun}_list").get(f"{k.noun}s", [])
        return sorted((Peer.from_fields(d, kind) for d in got), key=lambda p: p.id)

    # ------------------------------------------------------------------ observation
    def counters(self) -> dict:
        """The card's counters (docs/control-socket.md ``counters``): ports, types, drops, ring, mempool, state."""
        return self.call("counters")

    def state_summary(self) -> dict:
        return self.call("state_summary")

    def ring(self, last: int) -> list[dict]:
        """The headers of up to ``last`` message frames still waiting in the header ring, then of
        the ``last`` most recent ones the card forwarded; each group newest first: the card's
        ``ring_last`` entries (docs/control-socket.md: the bmv2 target's fields and more) plus
        ``in_ring`` (True: waiting in the ring; False: forwarded).

        Raises:
            ValueError: ``last`` < 0.
            OperationalError: the card cannot be reached.
        """
        if last < 0:
            raise ValueError(f"last must be >= 0, got {last}")
        if last == 0:
            return []
        size = int(self.ctl().call("ring_last", last=1)["log_size"])
        r = self.ctl().call("ring_last", last=min(int(last), size))
        return ([{**e, "in_ring": True} for e in r.get("in_ring", [])] +
                [{**e, "in_ring": False} for e in r.get("entries", [])])

    def state_dump(self, limit: int = 1000) -> list[dict]:
        return list(self.ctl(timeout=max(self.timeout, 30.0)).call("state_dump", limit=int(limit)).get("entries", []))

    def info(self) -> dict:
        return self.call("info")

    def reset_counters(self) -> None:
        self.ctl().call("reset_counters")

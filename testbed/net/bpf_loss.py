"""In-kernel random frame loss for kernels without ``sch_netem``: the ``bpf`` netem backend.

How: docs/testbed.md, "The bpf loss backend".
"""
from __future__ import annotations

import ctypes
import os
import platform
import struct

from embnic.control.errors import USAGE
from embnic.control.targets.dpdk.xdp import attached_xdp

from .procs import TestbedError

# bpf(2) commands and types (include/uapi/linux/bpf.h)
_BPF_MAP_CREATE, _BPF_MAP_LOOKUP_ELEM, _BPF_PROG_LOAD = 0, 1, 5
_BPF_MAP_GET_FD_BY_ID, _BPF_OBJ_GET_INFO_BY_FD = 14, 15
_BPF_MAP_TYPE_ARRAY = 2
_BPF_PROG_TYPE_XDP = 6
_BPF_PSEUDO_MAP_FD = 1
_FN_MAP_LOOKUP_ELEM, _FN_GET_PRANDOM_U32 = 1, 7
_XDP_DROP, _XDP_PASS = 1, 2
_NR_BPF = {"x86_64": 321, "aarch64": 280, "riscv64": 280, "armv7l": 386, "i686": 357, "ppc64le": 361,
           "s390x": 351}
_MAP_NAME = b"embnic_loss"
#: the programs' name (what ``ip -d link`` shows on an interface running one)
PROG_NAME = b"embnic_loss"

#: counter slots of the map: (direction, what) → index
COUNTERS = {("out", "frames"): 0, ("out", "dropped"): 1, ("in", "frames"): 2, ("in", "dropped"): 3}

_libc = ctypes.CDLL(None, use_errno=True)


class XdpHookTaken(TestbedError):
    """An end of the link already runs an XDP program (the card's ``net_af_xdp`` port, another
    tool's): the loss program cannot go there (a usage error: the CLI exits 2)."""

    category = USAGE


def _bpf(cmd: int, attr: bytes) -> int:
    """One bpf(2) call with ``attr`` (zero-padded to 128 bytes); returns its result or raises OSError."""
    nr = _NR_BPF.get(platform.machine())
    if nr is None:
        raise OSError(f"bpf(2) system call number unknown on {platform.machine()}")
    buf = ctypes.create_string_buffer(attr.ljust(128, b"\0"), 128)
    r = _libc.syscall(nr, cmd, buf, 128)
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return r


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    """One 8-byte eBPF instruction."""
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def _ld_imm64(dst: int, value: int, src: int = 0) -> bytes:
    """``dst = value`` (64-bit immediate, two slots; ``src`` = 1 makes ``value`` a map fd)."""
    return _insn(0x18, dst, src, 0, value & 0xFFFFFFFF) + _insn(0, 0, 0, 0, (value >> 32) & 0xFFFFFFFF)


def _count(map_fd: int, slot: int) -> bytes:
    """``map[slot] += 1`` (lookup on the stack key, atomic add; r0–r5 clobbered)."""
    return b"".join([
        _insn(0x62, 10, 0, -4, slot),          # *(u32 *)(r10 - 4) = slot
        _insn(0xBF, 2, 10),                     # r2 = r10
        _insn(0x07, 2, 0, 0, -4),               # r2 += -4
        _ld_imm64(1, map_fd, _BPF_PSEUDO_MAP_FD),  # r1 = map
        _insn(0x85, imm=_FN_MAP_LOOKUP_ELEM),   # r0 = bpf_map_lookup_elem(r1, r2)
        _insn(0x15, 0, 0, 2, 0),                # if r0 == 0 goto +2
        _insn(0xB7, 1, imm=1),                  # r1 = 1
        _insn(0xDB, 0, 1, 0, 0),                # lock *(u64 *)(r0 + 0) += r1
    ])


def program(loss_pct: float, map_fd: int, direction: str) -> bytes:
    """The XDP program of one end of a link: count the frame, drop it with probability
    ``loss_pct`` %.

    Args:
        loss_pct: percentage in [0, 100].
        map_fd: fd of the 4-slot counter map (:func:`_new_map`).
        direction: ``"out"`` (on the card's end: frames from the peer) or ``"in"`` (on the
            peer's end: frames from the card).

    Returns:
        the instructions (bytes, 8 per instruction).
    """
    thresh = min(1 << 32, int(round(loss_pct / 100.0 * (1 << 32))))
    drop = _count(map_fd, COUNTERS[direction, "dropped"])
    tail = _insn(0xB7, 0, imm=_XDP_PASS) + _insn(0x95)  # pass: r0 = XDP_PASS; exit
    shot = drop + _insn(0xB7, 0, imm=_XDP_DROP) + _insn(0x95)
    return b"".join([
        _count(map_fd, COUNTERS[direction, "frames"]),
        _insn(0x85, imm=_FN_GET_PRANDOM_U32),  # r0 = prandom u32
        _insn(0xBF, 6, 0),                      # r6 = r0 (callee-saved)
        _ld_imm64(1, thresh),                   # r1 = threshold
        _insn(0xAD, 6, 1, len(tail) // 8, 0),   # if r6 < r1 goto shot (skip the pass branch)
        tail,
        shot,
    ])


def _new_map() -> int:
    """A 4-slot u64 array map (the counters); returns its fd."""
    return _bpf(_BPF_MAP_CREATE, struct.pack("<IIIIIII16s", _BPF_MAP_TYPE_ARRAY, 4, 8, len(COUNTERS), 0, 0, 0,
                                             _MAP_NAME))


def _load(insns: bytes) -> int:
    """Load an XDP program; returns its fd. Raises OSError with the verifier's log."""
    code = ctypes.create_string_buffer(insns, len(insns))
    lic = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(1 << 16)
    # union bpf_attr for BPF_PROG_LOAD: prog_type, insn_cnt, insns, license, log_level, log_size,
    # log_buf, kern_version, prog_flags, prog_name[16] (`ip link` and bpftool show the name)
    attr = struct.pack("<IIQQIIQII16s", _BPF_PROG_TYPE_XDP, len(insns) // 8, ctypes.addressof(code),
                       ctypes.addressof(lic), 1, len(log), ctypes.addressof(log), 0, 0, PROG_NAME)
    try:
        return _bpf(_BPF_PROG_LOAD, attr)
    except OSError as e:
        raise OSError(e.errno, f"{e.strerror}: {log.value.decode(errors='replace').strip()[-300:]}") from None


def _map_info(fd: int) -> tuple[int, bytes]:
    """(kernel-wide id, name) of the map behind ``fd`` (struct bpf_map_info: type, id, key_size,
    value_size, max_entries, map_flags, name[16], ...)."""
    info = ctypes.create_string_buffer(80)
    _bpf(_BPF_OBJ_GET_INFO_BY_FD, struct.pack("<IIQ", fd, len(info), ctypes.addressof(info)))
    return struct.unpack_from("<II", info.raw)[1], struct.unpack_from("16s", info.raw, 24)[0].rstrip(b"\0")


def problem() -> str | None:
    """Why the ``bpf`` backend cannot run here (None if it can): loads a program and frees it."""
    try:
        m = _new_map()
        try:
            os.close(_load(program(1.0, m, "out")))
        finally:
            os.close(m)
    except OSError as e:
        return (f"the kernel refused the eBPF loss program ({e}): the bpf backend needs root and a kernel "
                f"with CONFIG_BPF_SYSCALL (XDP on veth)")
    return None


def _set_xdp(ns: str, ifname: str, fd: int) -> None:
    """Attach XDP program ``fd`` to ``ifname`` in ``ns`` (native mode: veth has it); -1 detaches.
    The netlink socket is made by this thread inside ``ns`` (pyroute2's own ``netns=`` forks a
    child to make it, which once found no interface in a busy demo process)."""
    from pyroute2 import IPRoute

    from embnic.control.netns import in_netns

    with in_netns(ns):
        ipr = IPRoute(groups=0)
    with ipr:
        idx = ipr.link_lookup(ifname=ifname)
        if not idx:
            raise TestbedError(f"no interface {ifname} in namespace {ns}")
        ipr.link("set", index=idx[0], xdp_fd=fd)


def attach(peer: tuple[str, str], card: tuple[str, str], loss_pct: float) -> dict:
    """Drop ``loss_pct`` % of the frames in each direction of one veth link.

    Args:
        peer: (namespace, interface) of the client's or shard's end.
        card: (namespace, interface) of the card's end.
        loss_pct: percentage in [0, 100].

    The ``out`` program runs on the card's end (frames from the peer), the ``in`` program on the
    peer's end (frames from the card); neither end may have an XDP program yet (a card on
    ``net_af_xdp`` holds the card's end with its own: refused, :class:`XdpHookTaken`).

    Returns:
        ``{"map_id": int}``: where :func:`read_counters` finds the counters.

    Raises:
        XdpHookTaken: an end already runs an XDP program (names it).
        TestbedError: the kernel refused the program or the attachment (names what is missing).
    """
    from pyroute2.netlink.exceptions import NetlinkError

    for ns, ifname in (card, peer):
        try:
            prog = attached_xdp(ifname, ns)
        except (LookupError, OSError):
            prog = None  # a missing interface: the attachment below names it
        if prog is not None:
            raise XdpHookTaken(f"interface {ifname} in namespace {ns} already runs XDP program {prog['name']} "
                               f"(id {prog['id']}){' (the card: net_af_xdp)' if prog['name'] == 'xsk_def_prog' else ''}; "
                               "the bpf backend needs that hook for its loss program and an interface has one: "
                               "use --backend user")
    m = _new_map()
    fds = [m]
    done: list[tuple[str, str]] = []
    try:
        progs = {d: _load(program(loss_pct, m, d)) for d in ("out", "in")}
        fds += list(progs.values())
        map_id = _map_info(m)[0]
        for d, (ns, ifname) in (("out", card), ("in", peer)):
            _set_xdp(ns, ifname, progs[d])
            done.append((ns, ifname))
    except (OSError, NetlinkError) as e:
        for ns, ifname in done:
            detach(ns, ifname)
        raise TestbedError(f"could not attach the eBPF loss program to the link {peer[1]}–{card[1]}: {e} "
                           f"(XDP on veth needs an MTU of at most about 3500 bytes)") from None
    finally:
        for fd in fds:
            os.close(fd)
    return {"map_id": map_id}


def detach(ns: str, ifname: str) -> None:
    """Remove the XDP program of ``ifname`` in ``ns`` (nothing if it has none or is gone)."""
    try:
        _set_xdp(ns, ifname, -1)
    except Exception:  # noqa: BLE001 - the namespace or interface may be gone already: nothing to remove
        pass


def read_counters(map_id: int | None) -> dict | None:
    """The counters of an attached loss program, in the ``user`` helper's shape: per direction
    (``out``: from the peer, ``in``: to it) ``{"in": frames seen, "out": frames passed,
    "dropped", "duplicated": 0, "reordered": 0}`` since it was attached; None once its programs
    are detached (or ``map_id`` is None)."""
    if not map_id:
        return None
    try:
        fd = _bpf(_BPF_MAP_GET_FD_BY_ID, struct.pack("<I", int(map_id)))
    except OSError:
        return None
    try:
        if _map_info(fd)[1] != _MAP_NAME:  # the programs are gone and the id went to another map
            return None
        raw: dict = {}
        key = ctypes.create_string_buffer(4)
        val = ctypes.create_string_buffer(8)
        for (d, what), slot in COUNTERS.items():
            struct.pack_into("<I", key, 0, slot)
            _bpf(_BPF_MAP_LOOKUP_ELEM, struct.pack("<IIQQ", fd, 0, ctypes.addressof(key), ctypes.addressof(val)))
            raw[d, what] = struct.unpack("<Q", val.raw)[0]
        return {d: {"in": raw[d, "frames"], "out": raw[d, "frames"] - raw[d, "dropped"],
                    "dropped": raw[d, "dropped"], "duplicated": 0, "reordered": 0} for d in ("out", "in")}
    except OSError:
        return None
    finally:
        os.close(fd)

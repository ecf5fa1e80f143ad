"""The numpy plan of a round and the readable per-table cut it was written after: the test oracles
of the C plan (``client_lib/csrc/plan.c`` through :func:`embnic.client_lib.native.prepare`, the
one production cut), moved here from ``client_lib/client.py`` (``pack_parts``) and
``client_lib/roundplan.py`` (``plan_round``, ``out_bases``). ``test_roundplan.py`` checks all three
cut a round alike; ``tests/control/test_plan.py`` checks the capacity planner's closed form against the C plan.

- :func:`by_shard` + :func:`pack_parts`: per table, each key's shard (:func:`split_by_shard`),
  then one shard's tables cut into messages by a loop over keys;
- :func:`plan_round`: every table at once, with a fixed number of numpy calls whatever the tables
  (a few ``searchsorted`` per message past the cap), laid out as a
  :class:`~embnic.client_lib.roundplan.RoundPlan`.
"""
from __future__ import annotations

import numpy as np

from embnic.client_lib import codec, consts
from embnic.client_lib.batch import as_ids
from embnic.client_lib.client import DEFAULT_MSG_FRAMES, DEFAULT_WINDOW_FRAMES
from embnic.client_lib.config import ClusterConfig
from embnic.client_lib.consts import DType, MsgType
from embnic.client_lib.roundplan import (C_DIR0, C_FRAMES, C_KA, C_KB, C_MSGLEN, C_NKEYS, C_NT, C_RFRAMES, C_SHARD,
                                         C_VLEN, C_VOFF, MSG_COLUMNS, RoundPlan, TableArrays, concat_ranges,
                                         shard_index)
from embnic.client_lib.routing import shard_index_of


def split_by_shard(cfg: ClusterConfig, table_id: int, keys: np.ndarray) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """Group one table's keys by owning shard, keeping their order within each shard (the C plan
    groups every table at once).

    Args:
        keys: uint64 (N,), typically the sorted unique value array of one table (any of
            0..2^64-1; integers are converted exactly, see :func:`~embnic.client_lib.batch.as_ids`).

    Returns:
        ``[(shard_id, positions int64 (n_s,), keys uint64 (n_s,)), ...]`` for every shard that
        owns at least one key, where ``keys[positions] == shard_keys``. ``positions`` is where the
        shard's reply rows go back in the table's value array. Empty for no keys.

    Raises:
        ValueError: keys not 1-D integers in 0..2^64-1.
    """
    keys = as_ids(keys)
    idx = shard_index_of(cfg, table_id, keys)
    # a stable sort of small ints is a radix sort in numpy: O(N) for uint8
    order = np.argsort(idx.astype(np.uint8) if len(cfg.shards) <= 256 else idx, kind="stable")
    counts = np.bincount(idx, minlength=len(cfg.shards))
    out, start = [], 0
    for i, n in enumerate(counts.tolist()):
        if n:
            pos = order[start:start + n]
            out.append((cfg.shards[i].id, pos, keys[pos]))
            start += n
    return out


def by_shard(cfg: ClusterConfig, keys_of: dict[int, np.ndarray]) -> dict[int, list]:
    """Every table's keys grouped by owning shard, for one round: ``{shard_id: [(table_id,
    positions int64 (k,), keys uint64 (k,)), ...]}``, tables in the order given, keys in their
    order within a table (:func:`split_by_shard`); ``positions``
    index the table's keys."""
    out: dict[int, list] = {}
    for table_id, keys in keys_of.items():
        for shard_id, pos, skeys in split_by_shard(cfg, table_id, as_ids(keys)):
            out.setdefault(shard_id, []).append((table_id, pos, skeys))
    return out


def pack_parts(cfg: ClusterConfig, msg_type: int, parts: list, *, mtu: int,
               msg_frames: int | None = DEFAULT_MSG_FRAMES, window_frames: int = DEFAULT_WINDOW_FRAMES) -> list[list]:
    """Cut one shard's ``parts`` — ``[(table_id, positions, keys), ...]``, every table it holds
    keys of (positions int64 (k,), keys uint64 (k,); anything with ``len`` and slicing, e.g.
    ``range``, serves a planner that needs only the counts) — into the messages of a round: as
    few as fit, in table order, a table's keys split across two messages only where one would
    overflow. A message fits when it and its reply each take at most ``msg_frames`` (and
    :data:`consts.MAX_FRAGS`) fragments of ``P = mtu - 72`` bytes and, where the send window
    allows it, both together leave the window room (``window_frames - 2`` frames of ``P``
    bytes). The rule the C plan (``client_lib/csrc/plan.c``) applies to every shard at once.

    Returns:
        the pieces, each a list of ``(table_id, positions, keys)`` slices (views, no copies).

    Raises:
        KeyError: a table not in ``cfg``. ValueError: an MTU without room for a body byte.
    """
    P = consts.max_body_per_frame(mtu)
    frags = consts.MAX_FRAGS if not msg_frames else min(msg_frames, consts.MAX_FRAGS)
    B = frags * P
    W = (window_frames - 2) * P if window_frames >= 3 else None
    lookup = msg_type == MsgType.LOOKUP_REQ
    pieces: list[list] = []
    cur: list = []
    req = rep = 0
    for table_id, pos, keys in parts:
        t = cfg.table(table_id)
        row = t.dim * consts.esize(t.wire_dtype)
        rk, pk = (consts.KEY_SIZE, row) if lookup else (consts.KEY_SIZE + row, 0)
        a, n = 0, len(keys)
        while a < n:
            room = (B - req - consts.DIR_ENTRY) // rk
            if pk:
                room = min(room, (B - rep) // pk)
            if W is not None:
                room = min(room, (W - req - rep - consts.DIR_ENTRY) // (rk + pk))
            if room <= 0 and cur:
                pieces.append(cur)
                cur, req, rep = [], 0, 0
                continue
            k = min(n - a, max(1, room))
            cur.append((table_id, pos[a:a + k], keys[a:a + k]))
            req += consts.DIR_ENTRY + k * rk
            rep += k * pk
            a += k
    if cur:
        pieces.append(cur)
    return pieces


def plan_round(ta: TableArrays, msg_type: int, tix: np.ndarray, counts: np.ndarray, keys: np.ndarray, *,
               mtu: int, msg_frames: int | None, window_frames: int) -> RoundPlan:
    """Plan a lookup (``LOOKUP_REQ``) or update (``UPDATE_REQ``) round (module docstring).

    Args:
        ta: the config's tables. tix: int64 (T,) tables of the call (indices into ``ta``, each
            at most once). counts: int64 (T,). keys: uint64 (N,), call order, checked already.
        mtu, msg_frames, window_frames: the cut (:func:`pack_parts`).

    Returns:
        the :class:`RoundPlan` (no messages for no keys).

    Raises:
        ValueError: an MTU without room for a body byte.
    """
    tix = np.asarray(tix, np.int64)
    counts = np.asarray(counts, np.int64)
    T, N = len(tix), int(keys.size)
    ko = np.zeros(T + 1, np.int64)
    np.cumsum(counts, out=ko[1:])
    dims = ta.dim[tix]
    uniform = bool(T > 0 and (ta.dtype[tix] == DType.FP32).all() and (dims == dims[0]).all())
    sidx = shard_index(ta, tix, counts, keys)
    S = ta.num_shards
    order = np.argsort(sidx.astype(np.uint8) if S <= 256 else sidx, kind="stable")
    kt_call = np.repeat(np.arange(T, dtype=np.int64), counts)
    tkey = kt_call[order]
    gs = sidx[order]
    gkeys = keys[order]
    rb = ta.row_bytes[tix][tkey]
    so = np.zeros(N + 1, np.int64)
    np.cumsum(rb, out=so[1:])
    lookup = msg_type == MsgType.LOOKUP_REQ
    P = consts.max_body_per_frame(mtu)
    frags = consts.MAX_FRAGS if not msg_frames else min(msg_frames, consts.MAX_FRAGS)
    B = frags * P
    W = (window_frames - 2) * P if window_frames >= 3 else None
    # table runs of the grouped order (a new run where the shard or the table changes)
    newrun = np.ones(N, bool)
    if N > 1:
        newrun[1:] = (tkey[1:] != tkey[:-1]) | (gs[1:] != gs[:-1])
    run = np.cumsum(newrun) - 1
    rk = consts.KEY_SIZE + (0 if lookup else rb)  # request bytes per key
    pk = rb if lookup else np.zeros(N, np.int64)  # reply bytes per key
    CR = np.zeros(N + 1, np.int64)
    np.cumsum(np.broadcast_to(rk, (N,)), out=CR[1:])
    CP = np.zeros(N + 1, np.int64)
    np.cumsum(pk, out=CP[1:])
    scount = np.bincount(gs, minlength=S)
    s1 = np.cumsum(scount)
    s0 = s1 - scount
    present = np.flatnonzero(scount)
    # a shard's whole part in one message when it fits (the common case: no cut to search)
    runs_s = run[s1[present] - 1] - run[s0[present]] + 1
    req_s = consts.DIR_ENTRY * runs_s + CR[s1[present]] - CR[s0[present]]
    rep_s = CP[s1[present]] - CP[s0[present]]
    fits = (req_s <= B) & (rep_s <= B)
    if W is not None:
        fits &= req_s + rep_s <= W
    starts: list[int] = []
    split = np.flatnonzero(~fits).tolist()
    if split:
        # F[k-1] (k = 1..N) = 16·(run[k-1] + 1) + CR[k]: a prefix a..k-1 costs F[k-1] - 16·run[a] - CR[a]
        F = consts.DIR_ENTRY * (run + 1) + CR[1:]
        FW = F + CP[1:]
    for i in split:  # per message past the cap: a few searchsorted each
        a, end = int(s0[present[i]]), int(s1[present[i]])
        while a < end:
            starts.append(a)
            base = consts.DIR_ENTRY * int(run[a]) + int(CR[a])
            k = int(np.searchsorted(F, B + base, side="right"))  # keys a..k-1 fit the request cap
            if lookup:
                k = min(k, int(np.searchsorted(CP[1:], B + int(CP[a]), side="right")))
            if W is not None:
                k = min(k, int(np.searchsorted(FW, W + base + int(CP[a]), side="right")))
            a = min(end, max(k, a + 1))
    mstart = np.sort(np.concatenate([s0[present][fits], np.array(starts, np.int64)])).astype(np.int64)
    M = mstart.size
    mend = np.empty(M, np.int64)
    mend[:-1] = mstart[1:]
    if M:
        mend[-1] = N
    # shard boundaries always start a message, so [mstart, mend) never spans two shards
    first = np.zeros(N, bool)
    first[mstart] = True
    ent = newrun | first
    e0 = np.flatnonzero(ent)
    ecum = np.cumsum(ent) - 1
    ecount = np.diff(np.append(e0, N))
    et = tix[tkey[e0]]
    d = np.zeros(e0.size, codec.DIR_DTYPE)
    d["table_id"] = ta.ids[et]
    d["dim"] = ta.dim[et]
    d["dtype"] = ta.dtype[et]
    d["num_keys"] = ecount
    msgs = np.zeros((M, len(MSG_COLUMNS)), np.int64)
    if M:
        msgs[:, C_SHARD] = gs[mstart]
        msgs[:, C_DIR0] = ecum[mstart]
        msgs[:, C_NT] = ecum[mend - 1] - ecum[mstart] + 1
        msgs[:, C_KA] = mstart
        msgs[:, C_KB] = mend
        msgs[:, C_NKEYS] = mend - mstart
        msgs[:, C_VLEN] = so[mend] - so[mstart]
        msgs[:, C_VOFF] = so[mstart]
        msgs[:, C_MSGLEN] = consts.DIR_ENTRY * msgs[:, C_NT] + consts.KEY_SIZE * msgs[:, C_NKEYS] + (
            0 if lookup else msgs[:, C_VLEN])
        msgs[:, C_FRAMES] = np.maximum(1, -(-msgs[:, C_MSGLEN] // P))
        msgs[:, C_RFRAMES] = np.maximum(1, -(-msgs[:, C_VLEN] // P)) if lookup else 1
        # sending order: shards in the order a walk over the tables meets them (by the first table
        # holding keys of theirs, then by index), a shard's messages in key order
        rank = np.empty(S, np.int64)
        rank[present[np.lexsort((present, tkey[s0[present]]))]] = np.arange(present.size)
        msgs = msgs[np.argsort(rank[msgs[:, C_SHARD]], kind="stable")]
    plan = RoundPlan(msg_type, tix, counts, ko, order, gkeys, tkey, rb, so, d, msgs, uniform,
                     int(dims[0]) if uniform else 0, ta)
    # the lookup's output buffer, as the C plan lays it out (RoundPlan.out_layout; moved from roundplan.py)
    dbase, dstride, plan.V, plan.nbytes = out_bases(ta, tix, counts)
    plan.dst = dbase[tkey] + (order - ko[tkey]) * dstride[tkey]  # each grouped key's place in its table
    plan.dims, plan.vo = dims, np.concatenate([[0], np.cumsum(dims * counts)]).astype(np.int64)
    return plan


def out_bases(ta: TableArrays, tix: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Where a lookup's rows go in its output buffer (:meth:`RoundPlan.out_layout`): key ``q`` of
    table ``t`` (of the call) at byte ``dbase[t] + q * dstride[t]``: ``(dbase int64 (T,), dstride
    int64 (T,), V, bytes)``. fp32 tables' rows go to the float32 values one table after the other,
    fp16 tables' to the staging area after them (2 bytes a value)."""
    dims = ta.dim[tix]
    vals = dims * counts
    vo = np.zeros(len(dims) + 1, np.int64)
    np.cumsum(vals, out=vo[1:])
    V = int(vo[-1])
    fp16 = ta.dtype[tix] == DType.FP16
    if not fp16.any():
        return 4 * vo[:-1], 4 * dims, V, 4 * V
    sv = np.zeros(len(dims) + 1, np.int64)
    np.cumsum(np.where(fp16, vals, 0), out=sv[1:])
    return (np.where(fp16, 4 * V + 2 * sv[:-1], 4 * vo[:-1]), np.where(fp16, 2 * dims, 4 * dims), V,
            4 * V + 2 * int(sv[-1]))


def msg_directory(plan: RoundPlan, m: int) -> np.ndarray:
    """Message ``m``'s directory entries (a view of ``plan.dir``)."""
    r = plan.msgs[m]
    return plan.dir[r[C_DIR0]:r[C_DIR0] + r[C_NT]]


def msg_keys(plan: RoundPlan, m: int) -> np.ndarray:
    """Message ``m``'s keys uint64 (n,) (a view)."""
    r = plan.msgs[m]
    return plan.keys[r[C_KA]:r[C_KB]]


def scatter_index(plan: RoundPlan, ka: int, kb: int, dst: np.ndarray) -> np.ndarray:
    """Byte positions in the output buffer of a reply whose rows are the grouped keys ``ka..kb``:
    int64 (Σ rb,)."""
    return concat_ranges(dst[ka:kb], plan.rb[ka:kb])

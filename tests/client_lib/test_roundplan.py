"""The round plan — the C plan (client_lib/csrc/plan.c through ``clientref.c_plan``, the production
cut), array for array equal to the numpy plan it was written after (``pyplan.plan_round``, a test
oracle) — against the per-table reference: the same messages (shard, directory, keys, in the same
order) as grouping every table by ``routing.split_by_shard`` and cutting each shard's part with
``pyplan.pack_parts``; the same
update bodies as ``codec.values_to_body`` per message; reply rows put back where ``lookup`` put
them table by table — on random configs (dims, fp32/fp16, hash and table sharding, 1–3 shards),
random key counts (empty tables too) and cuts (``msg_frames``, the send window, the MTU).

Run alone: python3 -m pytest -q tests/client_lib/test_roundplan.py
"""
from __future__ import annotations

import numpy as np
import pytest

from embnic.client_lib import codec, consts, precheck
from embnic.client_lib.config import parse_config
from embnic.client_lib.consts import MsgType
from embnic.client_lib.roundplan import C_KA, C_KB, C_SHARD, C_VLEN, C_VOFF, TableArrays
from clientref import c_plan
from pyplan import by_shard, msg_directory, msg_keys, pack_parts, plan_round, scatter_index


def random_cfg(rng, sharding):
    T = int(rng.integers(1, 9))
    ids = rng.choice(np.arange(200), T, replace=False)
    tables = [{"id": int(t), "dim": int(rng.choice([1, 3, 8, 16, 64])), "dtype": str(rng.choice(["fp32", "fp16"])),
               **({"rows": 1000} if rng.random() < 0.3 else {})} for t in ids]
    S = int(rng.integers(1, 4))
    return parse_config({"cluster": {"sharding": sharding},
                         "tables": tables, "shards": [{"id": 10 + 3 * i, "ip": "127.0.0.1", "port": 7900 + i}
                                                      for i in range(S)],
                         "clients": [{"id": 1, "ip": "127.0.0.1", "port": 7990}]})


def random_round(rng, cfg):
    req = {}
    for t in rng.permutation([t.id for t in cfg.tables]).tolist()[:int(rng.integers(1, len(cfg.tables) + 1))]:
        n = int(rng.choice([0, 1, 5, 40, 300, 2000]))
        hi = cfg.table(t).rows or 2**64 - 1
        req[t] = np.unique(rng.integers(0, hi, n, dtype=np.uint64, endpoint=cfg.table(t).rows is None))
    return req


def reference_messages(cfg, msg_type, req, **cut):
    """[(shard_id, [(table_id, positions, keys), ...])] in the order EmbeddingClient sends them."""
    return [(sid, piece) for sid, parts in by_shard(cfg, req).items()
            for piece in pack_parts(cfg, msg_type, parts, **cut)]


@pytest.mark.parametrize("sharding", ["hash", "table"])
@pytest.mark.parametrize("msg_type", [MsgType.LOOKUP_REQ, MsgType.UPDATE_REQ])
def test_plan_cuts_the_round_as_the_per_table_reference(sharding, msg_type):
    rng = np.random.default_rng(1 if sharding == "hash" else 2)
    for _ in range(60):
        cfg = random_cfg(rng, sharding)
        ta = TableArrays(cfg)
        req = random_round(rng, cfg)
        if msg_type == MsgType.UPDATE_REQ and rng.random() < 0.5:  # an update's unique keys in any order
            req = {t: rng.permutation(k) for t, k in req.items()}
        cut = {"mtu": int(rng.choice([576, 1500, 9000])), "msg_frames": [None, 1, 3, 64][int(rng.integers(4))],
               "window_frames": int(rng.choice([1, 3, 8, 512]))}
        tix, counts, keys = precheck.lookup_flat(cfg, ta, req)
        plan = plan_round(ta, msg_type, tix, counts, keys, **cut)
        assert_same_plan_in_c(plan, ta, msg_type, tix, counts, keys, cut)
        ref = reference_messages(cfg, msg_type, req, **cut)
        assert plan.num_msgs == len(ref), cut
        shard_ids = [s.id for s in cfg.shards]
        ko = dict(zip(req, np.concatenate([[0], np.cumsum(counts)[:-1]]).tolist()))
        for m, (sid, piece) in enumerate(ref):
            assert shard_ids[plan.msgs[m, C_SHARD]] == sid
            d = msg_directory(plan, m)
            assert d["table_id"].tolist() == [t for t, _, _ in piece]
            assert d["num_keys"].tolist() == [len(k) for _, _, k in piece]
            assert [int(x) for x in d["dim"]] == [cfg.table(t).dim for t, _, _ in piece]
            assert [int(x) for x in d["dtype"]] == [int(cfg.table(t).wire_dtype) for t, _, _ in piece]
            assert np.array_equal(msg_keys(plan, m), np.concatenate([k for _, _, k in piece]))
            # the grouped order points back at each key's place in the call
            assert np.array_equal(plan.order[plan.msgs[m, C_KA]:plan.msgs[m, C_KB]],
                                  np.concatenate([ko[t] + p for t, p, _ in piece]))
            assert plan.msgs[m, C_VLEN] == codec.value_len_of(d)


def assert_same_plan_in_c(plan, ta, msg_type, tix, counts, keys, cut):
    """The C plan (client_lib/csrc/plan.c) equals the numpy one, array for array."""
    c = c_plan(ta, msg_type, tix, counts, keys, **cut)
    for f in ("order", "keys", "tkey", "rb", "so", "msgs"):
        assert np.array_equal(getattr(c, f), getattr(plan, f)), f
    assert c.dir.tobytes() == plan.dir.tobytes()
    assert (c.uniform, c.dim) == (plan.uniform, plan.dim)
    if msg_type == MsgType.LOOKUP_REQ:
        assert np.array_equal(c.out_layout()[0], plan.out_layout()[0])
        assert c.out_layout()[1:] == plan.out_layout()[1:]


def rows_of(cfg, t, keys):
    """A row per key that depends on (table, key): float32 (n, dim), exact in fp16 too."""
    dim = cfg.table(t).dim
    return ((keys % np.uint64(1000)).astype(np.float32)[:, None] / 8 + np.arange(dim, dtype=np.float32) + t)


@pytest.mark.parametrize("sharding", ["hash", "table"])
def test_replies_land_on_their_rows_and_update_bodies_match(sharding):
    rng = np.random.default_rng(3)
    for _ in range(40):
        cfg = random_cfg(rng, sharding)
        ta = TableArrays(cfg)
        req = random_round(rng, cfg)
        cut = {"mtu": 1500, "msg_frames": int(rng.choice([2, 64])), "window_frames": 512}
        tix, counts, keys = precheck.lookup_flat(cfg, ta, req)
        plan = plan_round(ta, MsgType.LOOKUP_REQ, tix, counts, keys, **cut)
        assert_same_plan_in_c(plan, ta, MsgType.LOOKUP_REQ, tix, counts, keys, cut)
        dst, V, nbytes = plan.out_layout()
        out = np.full(nbytes, 0xAB, np.uint8)
        for m in range(plan.num_msgs):  # each message's reply as a shard builds it: rows in directory order
            d, k = msg_directory(plan, m), msg_keys(plan, m)
            parts, a = [], 0
            for e in d:
                n = int(e["num_keys"])
                parts.append(codec.rows_to_body(rows_of(cfg, int(e["table_id"]), k[a:a + n]), int(e["dtype"])))
                a += n
            body = b"".join(parts)
            ka, kb = int(plan.msgs[m, C_KA]), int(plan.msgs[m, C_KB])
            if plan.uniform:
                out.view(np.float32).reshape(-1, plan.dim)[plan.order[ka:kb]] = np.frombuffer(body, "<f4").reshape(
                    kb - ka, plan.dim)
            else:
                out[scatter_index(plan, ka, kb, dst)] = np.frombuffer(body, np.uint8)
        got = plan.split(plan.finish(out))
        assert list(got) == list(req)
        for t, k in req.items():
            want = rows_of(cfg, t, k)
            if cfg.table(t).dtype == "fp16":
                want = want.astype(np.float16).astype(np.float32)
            assert got[t].shape == (len(k), cfg.table(t).dim) and np.array_equal(got[t], want), t
        # an update's bodies: each message's values are its tables' gradient rows, in its directory order
        grads = {t: rng.standard_normal((len(k), cfg.table(t).dim)).astype(np.float32) for t, k in req.items()}
        flat = np.concatenate([g.reshape(-1) for g in grads.values()]) if grads else np.zeros(0, np.float32)
        up = plan_round(ta, MsgType.UPDATE_REQ, tix, counts, keys, **cut)
        vals = up.values(flat)
        ref = reference_messages(cfg, MsgType.UPDATE_REQ, req, **cut)
        for m, (sid, piece) in enumerate(ref):
            want = codec.values_to_body([grads[t][p] for t, p, _ in piece],
                                        [int(cfg.table(t).wire_dtype) for t, _, _ in piece])
            v0, vl = int(up.msgs[m, C_VOFF]), int(up.msgs[m, C_VLEN])
            assert vals[v0:v0 + vl].tobytes() == want


def test_flat_checks_refuse_what_the_per_table_checks_refuse():
    cfg = parse_config({"cluster": {}, "tables": [{"id": 0, "rows": 10, "dim": 2}, {"id": 4, "dim": 2, "dtype": "fp16"}],
                        "shards": [{"id": 0, "ip": "127.0.0.1", "port": 7900}],
                        "clients": [{"id": 1, "ip": "127.0.0.1", "port": 7990}]})
    ta = TableArrays(cfg)
    k = np.array([1, 2], np.uint64)
    g = np.ones((2, 2), np.float32)
    with pytest.raises(ValueError, match="key 10 >= rows 10"):
        precheck.lookup_flat(cfg, ta, {0: np.array([1, 10], np.uint64)})
    with pytest.raises(ValueError, match="unknown table 3"):
        precheck.lookup_flat(cfg, ta, {3: k})
    with pytest.raises(ValueError, match="duplicate key 2"):
        precheck.update_flat(cfg, ta, {0: (np.array([2, 1, 2], np.uint64), np.ones((3, 2), np.float32))})
    with pytest.raises(ValueError, match="non-finite gradient"):
        precheck.update_flat(cfg, ta, {4: (k, np.array([[1, 7e4], [0, 0]], np.float32))})  # fp16 overflow
    with pytest.raises(ValueError, match="grads shape"):
        precheck.update_flat(cfg, ta, {0: (k, np.ones((3, 2), np.float32))})
    # what passes goes through flat: unsorted unique keys and int64 keys included
    tix, counts, keys, grads = precheck.update_flat(cfg, ta, {4: (np.array([5, 3], np.uint64), g), 0: (k, 2 * g)})
    assert tix.tolist() == [1, 0] and counts.tolist() == [2, 2] and keys.tolist() == [5, 3, 1, 2]
    assert grads.tolist() == [1.0] * 4 + [2.0] * 4
    tix, counts, keys = precheck.lookup_jagged(cfg, ta, [0, 4], [1, 2], np.array([3, 4, 5], np.int64))
    assert keys.dtype == np.uint64 and keys.tolist() == [3, 4, 5]
    with pytest.raises(ValueError, match="adding up"):
        precheck.lookup_jagged(cfg, ta, [0, 4], [1, 1], np.array([3, 4, 5], np.int64))
    with pytest.raises(ValueError, match="twice"):
        precheck.lookup_jagged(cfg, ta, [0, 0], [1, 2], np.array([3, 4, 5], np.int64))
    assert consts.KEY_SIZE == 8

"""The C test that an update passes every table rule as it is (``embnic_shard_update_ok``,
``testbed/server/csrc/answer.c``, through :meth:`CAnswer.update_ok`), against the state's rules
(:meth:`ShardState.table_fault`, ``store_fault``, the directory's ``parse_request_body``): on
random updates — valid ones (which C must take) and ones with a byte flipped, keys out of order,
repeated, out of range or another shard's, unknown tables, NaN/inf or huge gradients, header
counts that do not add up — C never takes an update the state's rules would refuse."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from embnic.client_lib import codec
from embnic.client_lib.consts import MsgType
from embnic.client_lib.routing import owns_tables
from embnic.testbed.server.engine import BatchShardServer
from embnic.testbed.server.shard_state import ShardState

from test_server import directory_of, make_cfg


def _update(cfg, rng, shard_id: int):
    """A valid update body for shard ``shard_id``: 1-3 tables, sorted distinct keys it owns,
    small gradients; (header, body uint8)."""
    tids = rng.choice([t.id for t in cfg.tables], int(rng.integers(1, 4)), replace=False).tolist()
    parts, grads = [], []
    for tid in tids:
        t = next(x for x in cfg.tables if x.id == tid)
        cand = np.unique(rng.integers(0, t.rows, 40).astype(np.uint64))
        mine = owns_tables(cfg, np.array([tid], np.int64), np.array([cand.size]), shard_id, cand)
        k = cand[mine][:int(rng.integers(1, 20))]
        if k.size == 0:
            k = cand[:0]
        parts.append((tid, k))
        grads.append((rng.standard_normal((k.size, t.dim)) * 0.1).astype(np.float32))
    parts = [(t, k) for t, k in parts if k.size]
    grads = [g for g in grads if g.size]
    if not parts:
        return None
    d = directory_of(cfg, parts)
    keys = np.concatenate([k for _, k in parts])
    vals = codec.values_to_body(grads, d["dtype"].tolist())
    body = np.frombuffer(d.tobytes() + keys.tobytes() + vals, np.uint8).copy()
    h = SimpleNamespace(msg_type=MsgType.UPDATE_REQ, num_tables=len(parts), num_keys=keys.size, value_len=len(vals))
    return h, body


def _state_refuses(state: ShardState, h, body) -> bool:
    try:
        rb = codec.parse_request_body(h, body)
    except (codec.DirectoryError, ValueError):  # a directory that does not add up, or past the body
        return True
    if (rb.keys.size != h.num_keys or len(rb.values) != h.value_len or
            len(body) != rb.key_offsets[-1] * 8 + h.num_tables * codec.consts.DIR_ENTRY + h.value_len):
        return True
    fault = state.table_fault(rb, state.gradients(rb))
    return fault is not None or (bool(state.disk_tids) and state.store_fault(rb) is not None)


def _mutate(cfg, rng, h, body):
    b = body.copy()
    h = SimpleNamespace(**vars(h))
    T, n = h.num_tables, h.num_keys
    ko = T * codec.consts.DIR_ENTRY
    vo = ko + 8 * n
    kind = int(rng.integers(0, 9))
    if kind == 0:  # a byte flipped anywhere
        b[int(rng.integers(0, b.size))] ^= np.uint8(1 << int(rng.integers(0, 8)))
    elif kind == 1 and n > 1:  # two keys swapped
        i = int(rng.integers(0, n - 1))
        k = b[ko:vo].view(np.uint64)
        k[i], k[i + 1] = k[i + 1], k[i]
    elif kind == 2 and n > 1:  # a key repeated
        i = int(rng.integers(0, n - 1))
        k = b[ko:vo].view(np.uint64)
        k[i + 1] = k[i]
    elif kind == 3:  # a key out of range, or of any shard
        b[ko:vo].view(np.uint64)[int(rng.integers(0, n))] = rng.integers(0, 2**64, dtype=np.uint64)
    elif kind == 4:  # a huge, NaN or inf gradient (fp32 or fp16 bytes alike)
        v = b[vo:]
        i = int(rng.integers(0, max(1, v.size // 2))) * 2
        v[i:i + 2] = np.array([rng.choice([0x7C00, 0x7E00, 0xFFFF, 0x7F80, 0x7BFF])], "<u2").view(np.uint8)
    elif kind == 5:  # header counts that do not add up
        setattr(h, rng.choice(["num_keys", "value_len", "num_tables"]), int(rng.integers(0, 70)))
    elif kind == 6:  # an unknown table
        b[0:2] = np.array([int(rng.integers(4, 70))], "<u2").view(np.uint8)
    elif kind == 7:  # truncated or extended
        b = b[:-1] if rng.random() < 0.5 else np.r_[b, np.uint8(0)]
    return h, b


@pytest.mark.parametrize("shards", [1, 2])
def test_c_update_check_never_takes_what_the_rules_refuse(shards):
    cfg = make_cfg(shards)
    srv = BatchShardServer(cfg, 0, "127.0.0.1", 0)
    srv.open()
    try:
        state, ans = srv.state, srv.answer
        assert state.update_ok is not None
        rng = np.random.default_rng(shards)
        taken = 0
        for _ in range(3000):
            u = _update(cfg, rng, 0)
            if u is None:
                continue
            h, body = u
            assert ans.update_ok(h, body) and not _state_refuses(state, h, body)
            taken += 1
            h2, b2 = _mutate(cfg, rng, h, body)
            if ans.update_ok(h2, b2):
                assert not _state_refuses(state, h2, b2), (vars(h2), b2.tobytes().hex())
        assert taken > 2000
    finally:
        srv.close()

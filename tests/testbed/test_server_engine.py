"""The shard's serving loop against the reference shard (tests/testbed/reference_shard.py): the
same frames in (messages of one to three tables, refusals, polls, junk), the same replies,
counters and rows out; the C intake and answer path against its numpy oracle
(tests/testbed/shard_oracle.py); batched socket I/O (recvmmsg/sendmmsg, UDP GSO) against plain sockets; exactly-once updates
over a simulated lossy link.

Run alone: python3 -m pytest -q tests/testbed/test_server_engine.py
"""
import contextlib
import ctypes
import random
import socket

import numpy as np
import pytest

from embnic.client_lib import codec, consts
from embnic.client_lib.client import set_socket_buffers
from embnic.client_lib.consts import MsgType
from embnic.client_lib.local import LocalBackend
from embnic.client_lib.reassembly import Reassembler
from embnic.client_lib.rowstore import TableShard, shared_tables
from embnic.testbed.server import canswer, udpio
from embnic.testbed.server.engine import BatchShardServer
from embnic.testbed.server.runner import ServerThread
from embnic.testbed.server.shard_state import ShardState

import clientref
from reference_shard import engine_kw
from shard_oracle import NumpyAnswer

from test_server import lookup_frames, make_cfg, multi_lookup_frames, multi_update_frames, update_frames

PROBE_ID = 0x7FFF0000
#: tables of several dims and dtypes (the row store's flat arena) — with a row longer than 256
#: values, computed in pieces in C — and of one dim (its (rows, dim) arena)
TABLES_MIXED = [{"id": 0, "rows": 2000, "dim": 8, "optimizer": "adagrad", "lr": 0.1},
                {"id": 1, "rows": 5000, "dim": 16, "optimizer": "sgd", "lr": 0.3},
                {"id": 3, "rows": 1000, "dim": 12, "optimizer": "adagrad", "dtype": "fp16"},
                {"id": 4, "rows": 900, "dim": 300, "optimizer": "sgd", "lr": 0.01, "dtype": "fp16"}]
TABLES_UNIFORM = [{"id": t, "rows": 3000, "dim": 8, "optimizer": "adagrad", "lr": 0.1} for t in (0, 1, 2, 5)]


def _mutate(frame, **fields):
    h = codec.parse_header(frame)._replace(**fields)
    return h.pack() + frame[consts.HDR_LEN:]


def _rt(frame):
    """``frame`` with RETRANSMIT set."""
    return frame[:4] + bytes([frame[4] | consts.Flags.RETRANSMIT]) + frame[5:]


def build_stream(cfg, seed):
    """A mixed request stream for shard 0 from clients 1 and 2: ``[(client, frame), ...]``.

    Lookups and updates of one to three tables (1..600 keys each, up to ~60 fragments),
    retransmitted updates with reordered and duplicated fragments, a reused message id with
    another body, refused requests (not owner, out of range, duplicate keys, NaN, wrong shard,
    unknown table, wrong dim — each in a message of several tables, some with the bad table
    after good ones) and frames that do not parse.
    """
    rng = np.random.default_rng(seed)
    pyr = random.Random(seed)
    out = []
    mid = {1: 1, 2: 1}
    mine = {t.id: clientref.owned_keys(cfg, t.id, 0) for t in cfg.tables}
    theirs = {t.id: clientref.owned_keys(cfg, t.id, 1) for t in cfg.tables}
    for step in range(90):
        c = 1 + step % 2
        nt = int(rng.choice([1, 1, 2, 3]))
        tabs = [cfg.tables[int(i)] for i in rng.permutation(len(cfg.tables))[:nt]]
        t = tabs[0]
        parts = []
        for tt in tabs:
            n = int(rng.choice([1, 3, 40, 250, 600]))
            parts.append((tt.id, np.sort(rng.choice(mine[tt.id], size=min(n, mine[tt.id].size),
                                                    replace=False)).astype(np.uint64)))
        keys = parts[0][1]
        kind = 1.0 if step % 10 == 9 else 0.85 * rng.random()  # every 10th: a bad case, each kind once
        m = mid[c]
        mid[c] += 1
        if kind < 0.4:
            fr = multi_lookup_frames(cfg, parts, m, client_id=c)
            if rng.random() < 0.3:
                pyr.shuffle(fr)
            out += [(c, f) for f in fr]
        elif kind < 0.85:
            up = [(tid, k, rng.standard_normal((k.size, cfg.table(tid).dim)).astype(np.float32)) for tid, k in parts]
            fr = multi_update_frames(cfg, up, m, client_id=c)
            if len(fr) > 1 and rng.random() < 0.3:
                # lost fragments recovered by a poll (the last one re-sent: NACK with what is held),
                # the missing ones re-sent, sometimes a second poll (acked from the window)
                keep = [i for i in range(len(fr) - 1) if rng.random() < 0.6]
                miss = [i for i in range(len(fr) - 1) if i not in keep]
                fr = ([fr[i] for i in keep] + [_rt(fr[-1])] + [_rt(fr[i]) for i in miss]
                      + ([_rt(fr[-1])] if rng.random() < 0.5 else []))
            out += [(c, f) for f in fr]
            if rng.random() < 0.4:  # a copy: reordered, two fragments twice (without RETRANSMIT: a
                # re-sent last fragment is a poll, answered when it finds the update incomplete —
                # per frame by the reference, per wake-up by the engine: test_server.py's poll tests)
                re = multi_update_frames(cfg, up, m, client_id=c)
                pyr.shuffle(re)
                # a fragment twice before the message completes, one again after it (which
                # opens a message that never completes)
                out += [(c, f) for f in re[:1] + re + re[:1]]
            if rng.random() < 0.15:  # the same id with another body: a new update
                out += [(c, f) for f in multi_update_frames(cfg, [(tid, k, 2 * g) for tid, k, g in up], m,
                                                            client_id=c)]
        else:
            bad = step // 10
            k2 = np.sort(np.r_[keys[:2], theirs[t.id][:1]]).astype(np.uint64)
            good = [(cfg.tables[-1].id, mine[cfg.tables[-1].id][:3])] if t.id != cfg.tables[-1].id else []
            if bad == 0:
                fr = multi_lookup_frames(cfg, good + [(t.id, k2)], m, client_id=c)  # NOT_OWNER
            elif bad == 1:  # duplicate keys in an update
                g = np.ones((keys.size + 1, t.dim), np.float32)
                fr = multi_update_frames(cfg, [(t.id, np.r_[keys, keys[:1]].astype(np.uint64), g)]
                                         + [(x, k, np.ones((k.size, cfg.table(x).dim), np.float32)) for x, k in good],
                                         m, client_id=c)
            elif bad == 2:
                g = np.ones((keys.size, t.dim), np.float32)
                g[-1, 0] = np.nan
                fr = update_frames(cfg, t.id, keys, g, m, client_id=c)
            elif bad == 3:
                fr = lookup_frames(cfg, t.id, keys, m, client_id=c, shard_id=1)  # WRONG_SHARD
            elif bad == 4:
                fr = multi_lookup_frames(cfg, parts + [(9, keys[:2])], m, client_id=c)  # UNKNOWN_TABLE 9
            elif bad == 5:
                fr = lookup_frames(cfg, t.id, keys, m, client_id=c, dim=t.dim + 1)  # DIM_MISMATCH
            elif bad == 6:
                fr = [f[:43] for f in lookup_frames(cfg, t.id, keys, m, client_id=c)]  # too_short
            elif bad == 7:
                fr = [f[:-3] for f in lookup_frames(cfg, t.id, keys, m, client_id=c)]  # bad_length
            else:  # a fragment contradicting its message's first fragment: frag_mismatch
                fr = lookup_frames(cfg, 1, mine[1][:250], m, client_id=c)
                fr[1] = _mutate(fr[1], status=1)
                out += [(c, f) for f in fr]
                fr = lookup_frames(cfg, t.id, np.r_[keys[:1], 2**40].astype(np.uint64), m + 1000, client_id=c)
            out += [(c, f) for f in fr]
    return out


def run_stream(cfg, engine, stream, **kw):
    """Send ``stream`` to a shard 0 of ``engine`` as fast as possible, then a probe per client;
    returns (reply frames per client sorted, counters, state)."""
    with ServerThread(cfg, 0, reassembly_timeout_s=600.0, **engine_kw(engine, kw)) as st:
        socks = {}
        for c in (1, 2):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            set_socket_buffers(s)
            s.bind(("127.0.0.1", 0))
            s.settimeout(20.0)  # a safety bound for a lost server, not a timing assertion
            socks[c] = s
        try:
            for c, f in stream:
                socks[c].sendto(f, st.address)
            key = clientref.owned_keys(cfg, 0, 0)[:1]
            got = {}
            for c, s in socks.items():
                s.sendto(lookup_frames(cfg, 0, key, PROBE_ID, client_id=c)[0], st.address)
                frames, re = [], Reassembler(expect="reply")
                while True:
                    data = s.recv(65536)
                    frames.append(data)
                    m = re.feed(data)
                    if m is not None and m.header.msg_id == PROBE_ID:
                        break
                got[c] = frames
            if hasattr(st.server, "flush_acks"):  # acks still waiting for the log's fdatasync (group commit)
                st.call(st.server.flush_acks)
                for c, s in socks.items():
                    s.setblocking(False)
                    with contextlib.suppress(BlockingIOError):
                        while True:
                            got[c].append(s.recv(65536))
            got = {c: sorted(f) for c, f in got.items()}
            counters = st.counters()
            state = st.state_dict()
        finally:
            for s in socks.values():
                s.close()
    return got, counters, state


def _comparable(c):
    c = dict(c)
    c.pop("engine", None)
    c["reassembly"] = {k: v for k, v in c["reassembly"].items() if k != "expired"}
    c["service"] = sum(c["service"]["hist"])  # times differ; every reply message is timed once
    return c


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("kw", [{"small": 0}, {"gso": False, "batch": 7, "small": 0, "c_intake": False},
                                {"small": 64, "c_intake": False}, {"batch": 7}, {"batch": 7, "c_answer": False}])
def test_batch_engine_equals_reference(seed, kw):
    """The serving loop (the C intake and answer path, and on its numpy oracle, checking frames
    as vectors or one by one) against the reference: streams of updates with polls, NACKs, acks
    from the window, duplicates, refusals of every kind, junk."""
    cfg = make_cfg()
    stream = build_stream(cfg, seed)
    ref = run_stream(cfg, "reference", stream)
    bat = run_stream(cfg, "batch", stream, **kw)
    c_path = kw.get("c_intake", True) and kw.get("c_answer", True)
    assert bat[1]["engine"]["intake"] == ("c" if c_path else "numpy")
    assert bat[1]["engine"]["answer"] == ("c" if c_path else "numpy")
    assert bat[0] == ref[0]  # every reply frame, byte for byte
    assert _comparable(bat[1]) == _comparable(ref[1])
    assert ref[1]["updates_applied"] > 5 and ref[1]["duplicates"] > 0 and sum(ref[1]["errors"].values()) > 3
    assert ref[1]["update_polls"] > 3 and ref[1]["update_nacks"] > 0
    assert sum(ref[1]["drops"].values()) > 0 and ref[1]["drops"]["frag_mismatch"] > 0
    assert ref[1]["reassembly"]["duplicate_frames"] > 0 and ref[1]["reassembly"]["pending"] > 0
    assert bat[1]["engine"]["wakeups"] < bat[1]["rx_frames"]  # many frames per wake-up
    # both ways of reassembling ran: whole from one wake-up, and fragment by fragment (the only
    # way that meets duplicate fragments, counted equal to the reference's above)
    assert bat[1]["engine"]["messages_whole"] > 0 and bat[1]["reassembly"]["duplicate_frames"] > 0
    for tid in ref[2]:
        for a, b in zip(bat[2][tid], ref[2][tid]):
            assert np.array_equal(a, b)


def test_the_shard_library_ships_with_the_package():
    """The shard's C library is built by the package (``pip install -e .``, ``make libs``): it
    loads, and the serving loop runs on it — there is no other production path."""
    assert canswer.load() is not None
    srv = BatchShardServer(make_cfg(), 0, "127.0.0.1", 0)
    srv.open()
    try:
        assert isinstance(srv.answer, canswer.CAnswer) and srv.answer.serving
    finally:
        srv.close()


def _frames_for_checks(cfg, rng):
    """Requests of every kind and size for shard 0, each also mutated in one header byte,
    shortened or left whole: (list of frames)."""
    out = []
    mine = clientref.owned_keys(cfg, 0, 0)
    for i in range(60):
        t = cfg.tables[i % len(cfg.tables)]
        keys = np.sort(rng.choice(clientref.owned_keys(cfg, t.id, 0), int(rng.choice([1, 5, 300])), replace=False))
        t2 = cfg.tables[(i + 1) % len(cfg.tables)]
        k2 = clientref.owned_keys(cfg, t2.id, 0)[:int(rng.choice([1, 40]))]
        if i % 2:
            fr = multi_lookup_frames(cfg, [(t.id, keys.astype(np.uint64))] + ([(t2.id, k2)] if i % 3 else []), 10 + i,
                                     client_id=1 + i % 2)
        else:
            g = rng.standard_normal((keys.size, t.dim)).astype(np.float32)
            fr = multi_update_frames(cfg, [(t.id, keys.astype(np.uint64), g)]
                                     + ([(t2.id, k2, np.ones((k2.size, t2.dim)))] if i % 3 else []), 10 + i,
                                     client_id=1 + i % 2)
        for f in fr:
            b = bytearray(f)
            r = rng.random()
            if r < 0.3:
                b[int(rng.integers(0, consts.HDR_LEN))] ^= 1 << int(rng.integers(0, 8))
            elif r < 0.35:
                b = b[:int(rng.integers(0, len(b)))]
            out.append(bytes(b))
    out.append(lookup_frames(cfg, 0, mine[:3], 7, dim=99)[0])
    return out


def test_c_intake_equals_the_numpy_intake():
    """Header checks and grouping by message, C against the numpy oracle, on valid, bit-flipped
    and cut frames, shuffled with duplicates, in batches of every size."""
    from embnic.testbed.server import intake

    cfg = make_cfg()
    rng = np.random.default_rng(5)
    frames = _frames_for_checks(cfg, rng)
    srv = BatchShardServer(cfg, 0, "127.0.0.1", 0)
    srv.open()
    try:
        ca = srv.answer
        bs = srv.bs
        oracle = NumpyAnswer(bs, srv.state)
        seen_ok = seen_whole = 0
        for trial in range(40):
            n = int(rng.integers(1, bs.batch + 1))
            pick = rng.integers(0, len(frames), n) if trial % 2 else np.arange(min(n, len(frames)))
            n = len(pick)
            for r, j in enumerate(pick.tolist()):
                f = frames[j]
                bs.rx[r, :len(f)] = np.frombuffer(f, np.uint8)
                bs.lens[r] = len(f)
            cols_py, ok_py, p_py = (a.copy() for a in oracle.check_vector(n))
            cols_c, ok_c, p_c = ca.check(n)
            full = bs.lens[:n] >= consts.HDR_LEN
            assert np.array_equal(cols_c[full], cols_py[full]) and not cols_c[~full].any()
            assert np.array_equal(ok_c, ok_py) and np.array_equal(p_c[ok_c], p_py[ok_py])
            mg = np.flatnonzero(ok_c & (cols_c[:, intake.FC] > 1))
            if mg.size:
                order, grp = ca.whole(mg)
                ref = oracle.group(mg, cols_c, p_c)
                assert np.array_equal(order, ref[0])
                for j in range(6):
                    assert np.array_equal(grp[:, j], np.asarray(ref[1 + j]).astype(np.int64)), j
                seen_whole += int(grp[:, 5].sum())
            seen_ok += int(ok_c.sum())
        assert seen_ok > 100 and seen_whole > 5
    finally:
        srv.close()


def build_lookup_stream(cfg, seed, n=160):
    """Mostly lookups for shard 0 — one to three tables, 1..600 keys (single frames, fragmented
    requests and fragmented replies), rows never updated (computed) and updated — with now and
    then an update of rows they read (the C path answers lookups only up to a wake-up's first
    other frame), every 40th a lookup of thousands of keys of every table, a refused lookup (unknown table, wrong dim or dtype, a key out of range,
    another shard's key, a table twice in the directory), a duplicate, a retransmission."""
    rng = np.random.default_rng(seed)
    mine = {t.id: clientref.owned_keys(cfg, t.id, 0) for t in cfg.tables}
    theirs = {t.id: clientref.owned_keys(cfg, t.id, 1) for t in cfg.tables}
    out = []
    for m in range(1, n + 1):
        c = 1 + m % 2
        tabs = [cfg.tables[int(i)] for i in rng.permutation(len(cfg.tables))[:int(rng.choice([1, 1, 2, 3]))]]
        parts = [(t.id, np.sort(rng.choice(mine[t.id], min(int(rng.choice([1, 2, 30, 250, 600])), mine[t.id].size),
                                           replace=False)).astype(np.uint64)) for t in tabs]
        r = rng.random()
        if r < 0.12:
            up = [(tid, k, rng.standard_normal((k.size, cfg.table(tid).dim)).astype(np.float32)) for tid, k in parts]
            out += [(c, f) for f in multi_update_frames(cfg, up, m, client_id=c)]
            continue
        if r < 0.22:
            t, k = parts[0]
            bad = m % 6
            if bad == 0:
                fr = multi_lookup_frames(cfg, parts + [(9, k[:2])], m, client_id=c)  # UNKNOWN_TABLE
            elif bad == 1:
                fr = lookup_frames(cfg, t, k, m, client_id=c, dim=cfg.table(t).dim + 1)  # DIM_MISMATCH
            elif bad == 2:
                fr = lookup_frames(cfg, t, np.r_[k[:1], 10**6].astype(np.uint64), m, client_id=c)  # out of range
            elif bad == 3:
                fr = lookup_frames(cfg, t, np.sort(np.r_[k[:3], theirs[t][:1]]).astype(np.uint64), m,
                                   client_id=c)  # NOT_OWNER
            elif bad == 4:
                fr = multi_lookup_frames(cfg, [(t, k[:2]), (t, k[2:4])], m, client_id=c)  # a table twice
            else:
                other = 2 if cfg.table(t).wire_dtype == 1 else 1
                fr = lookup_frames(cfg, t, k, m, client_id=c, dtype=other)  # the wrong dtype
            out += [(c, f) for f in fr]
            continue
        if m % 40 == 0:  # a big one: every table, more keys than the C path sorts at once (4096)
            budget = consts.MAX_FRAGS * consts.max_body_per_frame(cfg.mtu) - 4096
            parts = []
            for t in cfg.tables:
                rowb = t.dim * (2 if t.dtype == "fp16" else 4)
                k = mine[t.id][:max(1, min(mine[t.id].size, budget // rowb))]
                budget -= k.size * rowb
                parts.append((t.id, k.astype(np.uint64)))
        fr = multi_lookup_frames(cfg, parts, m, client_id=c)
        out += [(c, f) for f in fr]
        if r > 0.95:  # a duplicate, or a retransmission of its first fragment only
            out += [(c, f) for f in (fr if r > 0.975 else fr[:1])]
    return out


@pytest.mark.parametrize("tables", ["mixed", "uniform"])
@pytest.mark.parametrize("batch", [7, 64, 256])
def test_c_answer_equals_numpy_answer_frame_by_frame(tables, batch):
    """Lookups answered by the C path (dataplane/shard/answer.c: directory, checks, one pass of
    searches over every table, reply frames, sendmmsg + GSO) against its numpy oracle (the
    loop's numpy gather, shard_oracle.py's checks and replies) and the reference shard on the same
    frames: every reply frame byte for byte, every counter, every row. Mixed dims and dtypes
    (a flat arena; fp16 rows cast in C as numpy does) and one dim (a (rows, dim) arena)."""
    tabs = TABLES_MIXED if tables == "mixed" else TABLES_UNIFORM
    cfg = make_cfg(tables=tabs)
    stream = build_lookup_stream(cfg, batch)
    ref = run_stream(cfg, "reference", stream)
    num = run_stream(cfg, "batch", stream, batch=batch, c_answer=False)
    cc = run_stream(cfg, "batch", stream, batch=batch)
    assert num[1]["engine"]["answer"] == "numpy" and cc[1]["engine"]["answer"] == "c"
    assert cc[0] == num[0] == ref[0]  # every reply frame, byte for byte
    assert _comparable(cc[1]) == _comparable(num[1]) == _comparable(ref[1])
    for tid in ref[2]:
        for a, b, c in zip(cc[2][tid], num[2][tid], ref[2][tid]):
            assert np.array_equal(a, b) and np.array_equal(a, c)
    # every lookup that was not refused was answered in C: straight from the receive buffer (the
    # wake-up's lookups before its first other frame), or once the engine had reassembled it;
    # the refused ones (ERROR, the engine's rules) in Python
    e = cc[1]["engine"]
    assert e["answered_in_c"] == ref[1]["replies"]["LOOKUP_REPLY"] and e["answered_from_rx"] > 0, e
    assert sum(ref[1]["errors"].values()) >= 6 and ref[1]["updates_applied"] > 5
    assert e["messages_whole"] > 0 and e["gso_sends"] > 0


@pytest.mark.parametrize("c_answer", [True, False])
def test_rows_of_two_tables_sharing_a_composite_key(c_answer):
    """Row ids of two tables whose composite keys in the shard's one index are equal (key +
    table salt): each table's lookup finds its own row — or, before it was ever updated, its
    initial value, never the other table's row — in C and in numpy, as LocalBackend says."""
    cfg = make_cfg(1, tables=[{"id": 0, "rows": 100, "dim": 8}, {"id": 1, "dim": 8},  # (table 0: the probe's)
                              {"id": 2, "dim": 8, "optimizer": "sgd", "lr": 0.5}])
    ref = LocalBackend(cfg)
    probe = ShardState(cfg, 0)
    salt = {int(t): int(x) for t, x in zip(probe.store.table_ids, probe.store.tsalt)}
    probe.close()
    ka = np.array([123456789, 2**63 + 5], np.uint64)
    kb = ((ka.astype(object) + salt[1] - salt[2]) % 2**64).astype(np.uint64)
    order = np.argsort(kb)
    kb = kb[order]
    assert sorted(((kb.astype(object) + salt[2]) % 2**64).tolist()) == sorted(
        ((ka.astype(object) + salt[1]) % 2**64).tolist())
    g = np.ones((2, 8), np.float32)
    stream = [(1, f) for f in update_frames(cfg, 1, ka, g, 1)]  # table 1 only: kb's composites are table 1's
    ref.update({1: (ka, g)})
    stream += [(1, f) for f in multi_lookup_frames(cfg, [(1, ka), (2, kb)], 2)]
    stream += [(1, f) for f in lookup_frames(cfg, 2, kb, 3)]
    want = {2: np.concatenate([ref.lookup({1: ka})[1], ref.lookup({2: kb})[2]]), 3: ref.lookup({2: kb})[2]}
    stream += [(1, f) for f in update_frames(cfg, 2, kb, 3 * g, 4)]  # now both tables hold a row
    ref.update({2: (kb, 3 * g)})
    stream += [(1, f) for f in multi_lookup_frames(cfg, [(2, kb), (1, ka)], 5)]
    want[5] = np.concatenate([ref.lookup({2: kb})[2], ref.lookup({1: ka})[1]])
    got, counters, state = run_stream(cfg, "batch", stream, c_answer=c_answer)
    re = Reassembler(expect="reply")
    seen = {m.header.msg_id: m for m in (re.feed(f) for f in got[1]) if m is not None}
    for mid in (2, 3, 5):
        assert np.array_equal(np.frombuffer(seen[mid].body, "<f4").reshape(-1, 8), want[mid]), mid
    assert not np.array_equal(want[3], ref.lookup({1: ka})[1][order])  # not table 1's rows
    for tid in (1, 2):
        for a, b in zip(state[tid], ref.state_dict()[tid]):
            assert np.array_equal(a, b)
    assert counters["engine"].get("answered_in_c", 0) == (3 + 2 if c_answer else 0)  # and run_stream's 2 probes


class _OtherStore:
    """A table's rows in a store of another kind than the shard's shared one (as an on-disk
    store would be): TableShard's interface, its own RowStore behind it."""

    def __init__(self, table, seed):
        self._ts = TableShard(table, seed)
        self.table = table
        self.calls = 0

    def __len__(self):
        return len(self._ts)

    def lookup(self, keys):
        self.calls += 1
        return self._ts.lookup(keys)

    def apply(self, keys, grads):
        self.calls += 1
        self._ts.apply(keys, grads)

    def apply_segments(self, keys, g, offs):
        self.calls += 1
        self._ts.apply_segments(keys, g, offs)

    def state(self):
        return self._ts.state()

    def load_state(self, keys, rows, acc):
        self._ts.load_state(keys, rows, acc)


@pytest.mark.parametrize("kw", [{}, {"c_answer": False}])
def test_a_table_in_a_store_of_another_kind(kw):
    """The seam for other row stores (the table store a shard is given, testbed/server/stores.py
    ShardStores): a table whose rows live in a store of another kind is served through that store's own lookup/apply_segments
    (the C answer path leaves its lookups to the engine), the other tables from the shared
    store in one gather; replies, counters and rows equal the reference server's with every
    table in memory."""
    from embnic.testbed.server import stores

    cfg = make_cfg(tables=TABLES_MIXED)
    stream = build_lookup_stream(cfg, 11, n=80)
    ref = run_stream(cfg, "reference", stream)
    store, tables = shared_tables([t for t in cfg.tables if t.id != 1], cfg.seed)
    other = tables[1] = _OtherStore(cfg.table(1), cfg.seed)
    got = run_stream(cfg, "batch", stream, stores=stores.ShardStores(tables, store), **kw)
    assert got[0] == ref[0]
    assert _comparable(got[1]) == _comparable(ref[1])
    for tid in ref[2]:
        for a, b in zip(got[2][tid], ref[2][tid]):
            assert np.array_equal(a, b)
    assert other.calls > 5 and len(other) > 0


def test_c_fp16_cast_equals_numpy():
    """float32 -> float16 in C (store.c, for fp16 tables' replies) against numpy's cast: every
    pattern near the subnormal, normal and overflow edges, ties, and a million random ones;
    NaN stays NaN (rows are never NaN: updates that would make one are refused)."""
    lib = canswer.load()
    lib.embnic_shard_to_f16.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    lib.embnic_shard_to_f16.restype = None
    rng = np.random.default_rng(0)
    edges = np.array([0x33000000, 0x33800000, 0x38000000, 0x38800000, 0x477FE000, 0x477FF000, 0x47800000,
                      0x7F800000, 0x00000001, 0x007FFFFF, 0x3F800000], np.uint32)
    near = (edges[:, None].astype(np.int64) + np.arange(-4096, 4097)).reshape(-1)
    near = near[(near >= 0) & (near < 2**31)].astype(np.uint32)
    ties = ((rng.integers(0x33000000, 0x47800000, 20000, dtype=np.uint32) & ~np.uint32(0x1FFF))
            | np.uint32(0x1000))  # exactly half way between two halves
    bits = np.concatenate([near, near | np.uint32(0x80000000), ties,
                           rng.integers(0, 2**32, 1_000_000, dtype=np.uint64).astype(np.uint32)])
    out = np.empty(bits.size, np.uint16)
    lib.embnic_shard_to_f16(bits.ctypes.data, out.ctypes.data, bits.size)
    f = bits.view(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        want = f.astype(np.float16).view(np.uint16)
    nan = np.isnan(f)
    assert np.array_equal(out[~nan], want[~nan])
    assert np.isnan(out[nan].view(np.float16)).all()


def test_batch_engine_equals_local_backend_when_updates_share_a_wakeup():
    """Overlapping updates of one table in one wake-up apply one after the other; disjoint ones
    together; a lookup queued after them sees them: rows equal LocalBackend's, bit for bit."""
    cfg = make_cfg(1)
    ref = LocalBackend(cfg)
    rng = np.random.default_rng(4)
    keys = clientref.owned_keys(cfg, 0, 0)[:300]
    stream = []
    for m in range(1, 13):
        k = np.sort(rng.choice(keys, 100, replace=False)).astype(np.uint64)
        g = rng.standard_normal((100, 8)).astype(np.float32)
        stream += [(1, f) for f in update_frames(cfg, 0, k, g, m)]
        ref.update({0: (k, g)})
    stream += [(1, f) for f in lookup_frames(cfg, 0, keys, 99)]
    got, counters, state = run_stream(cfg, "batch", stream)
    assert counters["updates_applied"] == 12
    for a, b in zip(state[0], ref.state_dict()[0]):
        assert np.array_equal(a, b)
    re = Reassembler(expect="reply")
    msgs = [m for m in (re.feed(f) for f in got[1]) if m is not None and m.header.msg_id == 99]
    assert np.array_equal(np.frombuffer(msgs[0].body, "<f4").reshape(300, 8), ref.lookup({0: keys})[0])


def test_udpio_gso_and_plain_send_the_same_datagrams():
    """A reply laid out in rows goes out as the same datagrams with GSO, without, and through
    plain sendto (a lone small reply); mmsghdr entries filled one by one or as vectors."""
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    set_socket_buffers(rx)
    rx.bind(("127.0.0.1", 0))
    rx.settimeout(10.0)
    width = 100
    buf = np.random.default_rng(0).integers(0, 256, (150, width), dtype=np.uint8)
    lens = np.full(150, width, np.int64)
    lens[[69, 149]] = [37, 1]
    starts, counts = np.array([0, 70]), np.array([70, 80])
    names = np.stack([np.frombuffer(udpio.tuple_to_sockaddr(rx.getsockname()), np.uint8)] * 2)
    want = [bytes(buf[r, :lens[r]]) for r in range(150)]
    for gso, plain, scalar_max in ((True, False, 8), (True, False, 0), (False, False, 8), (False, False, 0),
                                   (False, True, 8)):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("127.0.0.1", 0))
        bs = udpio.BatchSocket(s, gso=gso)
        bs.scalar_max = scalar_max  # entries filled one by one (struct) or as numpy vectors
        if plain:  # a lone reply of at most small_send frames goes out with plain sendto
            bs.small_send = 150
            assert sum(bs.send(buf, starts[j:j + 1], counts[j:j + 1], lens, names[j:j + 1]) for j in (0, 1)) == 150
        else:
            assert bs.send(buf, starts, counts, lens, names) == 150
        got = [rx.recv(65536) for _ in range(150)]
        assert got == want, (gso, plain, scalar_max)
        if gso:
            assert bs.stats["gso_sends"] >= 3 and bs.stats["send_calls"] == 1
        # and back in: recvmmsg gets them in order with their source
        back = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        back.bind(("127.0.0.1", 0))
        rb = udpio.BatchSocket(back, batch=64)
        for w in want[:10]:
            s.sendto(w, back.getsockname())
        n = 0
        while n < 10:
            k = rb.recv()
            for i in range(k):
                assert bytes(rb.rx[i, :rb.lens[i]]) == want[n]
                assert udpio.sockaddr_to_tuple(rb.names[i]) == s.getsockname()
                n += 1
        back.close()
        s.close()
    rx.close()


REFUSAL_TABLES = [
    {"id": 0, "rows": 2000, "dim": 8, "optimizer": "adagrad", "lr": 0.1},
    {"id": 1, "rows": 2000, "dim": 4, "optimizer": "sgd", "lr": 1e30},
    {"id": 3, "rows": 1000, "dim": 12, "optimizer": "adagrad", "dtype": "fp16"},
]


@pytest.mark.parametrize("engine,kw", [("reference", {}), ("batch", {"small": 0}), ("batch", {"c_intake": False})])
def test_shard_refuses_exactly_the_gradients_local_backend_refuses(engine, kw):
    """One rule (table_numerics.gradient_rows_ok, docs/protocol.md "Reliability"): a finite gradient
    whose step overflows float32 — Adagrad's g² for |g| = 1e20, SGD's lr·g — is refused like NaN/inf,
    the whole message (MALFORMED, nothing applied); both engines and LocalBackend refuse the same
    messages and end with the same rows, bit for bit, all finite."""
    cfg = make_cfg(1, tables=REFUSAL_TABLES)
    ref = LocalBackend(cfg)
    rng = np.random.default_rng(5)
    own = {t.id: clientref.owned_keys(cfg, t.id, 0)[:40] for t in cfg.tables}
    big = np.float32(1e20)
    cases = []  # (table, gradient, refused?)
    for tid, dim in ((0, 8), (1, 4), (3, 12)):
        cases.append((tid, rng.standard_normal((4, dim)).astype(np.float32), False))
    g = rng.standard_normal((4, 8)).astype(np.float32)
    g[2, 3] = big  # one row of four: the whole message goes
    cases += [(0, g, True),
              (0, np.full((4, 8), 1e18, np.float32), False),  # g² = 1e36: finite, applied
              (1, np.full((4, 4), 1e10, np.float32), True),   # lr·g = 1e40 overflows, g does not
              (1, np.full((4, 4), 1e-3, np.float32), False),
              (3, np.full((4, 12), 7e4, np.float32), True),   # inf in fp16 on the wire
              (0, np.full((4, 8), np.nan, np.float32), True)]
    stream, refused = [], set()
    for m, (tid, g, bad) in enumerate(cases, start=1):
        keys = np.sort(rng.choice(own[tid], 4, replace=False)).astype(np.uint64)
        with np.errstate(over="ignore"):
            stream += [(1, f) for f in update_frames(cfg, tid, keys, g, m)]
        try:
            ref.update({tid: (keys, g)})
        except ValueError as e:
            assert "non-finite gradient" in str(e)
            refused.add(m)
    assert refused == {m for m, c in enumerate(cases, start=1) if c[2]}
    got, counters, state = run_stream(cfg, engine, stream, **kw)
    re = Reassembler(expect="reply")
    errs = {m.header.msg_id: m.header.status for m in (re.feed(f) for f in got[1])
            if m is not None and m.header.msg_type == MsgType.ERROR}
    assert errs == {m: consts.Status.MALFORMED for m in refused}
    assert counters["updates_applied"] == len(cases) - len(refused)
    want = ref.state_dict()
    for tid in want:
        for a, b in zip(state[tid], want[tid]):
            assert np.array_equal(a, b)
        assert np.isfinite(state[tid][1]).all() and np.isfinite(state[tid][2]).all()


def _lossy_exchange(addr, msgs, rng, *, want, loss=0.3, dup=0.1, reorder=0.2, max_rounds=500, nack=False):
    """Deliver request messages ``{msg_id: frames}`` over a simulated lossy link until each is
    answered: ``loss`` of the frames lost, ``dup`` duplicated and ``reorder`` of adjacent pairs
    swapped on the way out, ``loss`` of the reply frames lost on the way back. Every round
    re-sends the unanswered messages whole — or, with ``nack``, as the client does
    (docs/protocol.md, "Reliability"): the first round whole, then a poll (the last fragment,
    RETRANSMIT) of each, and on an UPDATE_NACK at once exactly the fragments it lacks. Returns
    ``{msg_id: the reply's header}`` (``want``: the expected reply type), the rounds it took and
    the NACKs seen. 500 rounds: a 4-fragment message and its one-frame answer pass a round with
    p ≥ 0.7^5 ≈ 0.17 (more, since the shard keeps the fragments it holds): failing 500 times in
    a row has probability below 1e-40."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    set_socket_buffers(sock)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.05)  # the end of one round's answers, not a timing assertion
    got, nacks = {}, 0

    def send(frames):
        out = []
        for f in frames:
            if rng.random() >= loss:
                out += [f, f] if rng.random() < dup else [f]
        for i in range(len(out) - 1):
            if rng.random() < reorder:
                out[i], out[i + 1] = out[i + 1], out[i]
        for f in out:
            sock.sendto(f, addr)

    try:
        for rounds in range(1, max_rounds + 1):
            todo = [m for m in msgs if m not in got]
            if nack and rounds > 1:
                send([_rt(msgs[m][-1]) if len(msgs[m]) > 1 else _rt(msgs[m][0]) for m in todo])
            else:
                send([f for m in todo for f in msgs[m]])
            while True:
                try:
                    data = sock.recv(65536)
                except socket.timeout:
                    break
                if rng.random() < loss:
                    continue  # the answer was lost on its way back
                h = codec.parse_header(data, expect="reply")
                if nack and h.msg_type == MsgType.UPDATE_NACK:
                    nacks += 1
                    held = clientref.nack_held(data[consts.HDR_LEN:], len(msgs[h.msg_id]))
                    assert held[-1]  # the poll it answers is held
                    send([_rt(f) for f, have in zip(msgs[h.msg_id], held.tolist()) if not have])
                    continue
                assert h.msg_type == want, h
                got[h.msg_id] = h
            if len(got) == len(msgs):
                return got, rounds, nacks
    finally:
        sock.close()
    raise AssertionError(f"{len(msgs) - len(got)} messages unanswered after {max_rounds} rounds")


def _lossy_waves(cfg, seed, shard=0):
    """3 waves of 8 update messages of 2-3 tables each (≤ 4 fragments), keys disjoint within a
    wave and overlapping across waves: ``[[(msg_id, parts), ...], ...]``."""
    rng = np.random.default_rng(seed)
    pools = {t.id: clientref.owned_keys(cfg, t.id, shard)[:400] if t.rows else
             np.sort(rng.choice(2**62, 400, replace=False)).astype(np.uint64) for t in cfg.tables}
    waves, mid = [], 0x10000
    for _ in range(3):
        perm = {tid: rng.permutation(p.size) for tid, p in pools.items()}
        wave = []
        for j in range(8):
            tids = [cfg.tables[int(i)].id for i in rng.permutation(len(cfg.tables))[:int(rng.integers(2, 4))]]
            parts = []
            for tid in tids:
                k = np.sort(pools[tid][perm[tid][j * 25:j * 25 + int(rng.integers(5, 25))]])
                parts.append((tid, k, rng.standard_normal((k.size, cfg.table(tid).dim)).astype(np.float32)))
            wave.append((mid, parts))
            mid += 1
        waves.append(wave)
    return waves


@pytest.mark.parametrize("nack", [False, True])
@pytest.mark.parametrize("engine", ["batch", "reference"])
def test_multi_table_updates_exactly_once_over_a_lossy_link(engine, nack):
    """Updates of 2-3 tables each (≤ 4 fragments) through 30 % loss, 10 % duplication and 20 %
    reordering in both directions, re-sent until acknowledged — whole, or polled and re-sent only
    in the fragments an UPDATE_NACK says are missing: every message applied exactly once, all its
    tables (rows and Adagrad accumulators equal LocalBackend's bit for bit), the re-sends
    re-acked as duplicates."""
    cfg = make_cfg()
    ref = LocalBackend(cfg)
    rng = random.Random(7)
    with ServerThread(cfg, 0, **engine_kw(engine)) as st:
        rounds, nacks = [], 0
        for wave in _lossy_waves(cfg, 3):
            msgs = {mid: multi_update_frames(cfg, parts, mid) for mid, parts in wave}
            assert max(len(f) for f in msgs.values()) <= 4
            _, r, nk = _lossy_exchange(st.address, msgs, rng, want=MsgType.UPDATE_ACK, nack=nack)
            rounds.append(r)
            nacks += nk
            for _, parts in wave:
                for tid, k, g in parts:
                    ref.update({tid: (k, g)})
        c = st.counters()
        state = st.state_dict()
    assert c["updates_applied"] == 24 and c["duplicates"] > 0 and sum(c["errors"].values()) == 0
    assert max(rounds) > 1  # the link did lose what mattered
    assert (nacks > 0 and c["update_nacks"] >= nacks and c["update_polls"] > 0) if nack else c["update_nacks"] == 0
    want = ref.state_dict()
    for tid in want:
        for a, b in zip(state[tid], want[tid]):
            assert np.array_equal(a, b), tid

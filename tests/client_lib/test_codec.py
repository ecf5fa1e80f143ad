"""Protocol v2: Scapy layer golden bytes, codec ≡ Scapy (hypothesis), validation by reason, the
request directory.

Run alone: python3 -m pytest -q tests/client_lib/test_codec.py
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.all import IP, UDP, Ether, Raw, rdpcap, wrpcap

from embnic.client_lib import codec, consts
from embnic.client_lib.codec import DirectoryError, FrameError
from embnic.client_lib.consts import MsgType, Status
from embnic.client_lib.protocol import Embnic, EmbnicDirEntry

# a lookup of key 5 of table 3 (dim 8, fp32) and key 2^40+1 of table 4 (dim 2, fp16) to shard 1
GOLDEN_LOOKUP = bytes.fromhex(
    "454d" "02" "01"        # magic, version 2, LOOKUP_REQ
    "00" "00" "0000"        # flags, reserved0, status
    "00000007"              # msg_id
    "0002" "0001"           # client 2, shard 1
    "0002" "ffff"           # 2 tables, table_id NO_TABLE
    "00000002"              # num_keys
    "00000024"              # value_len 36: one 32-byte row + one 4-byte row
    "00000030"              # msg_len 48: 2 directory entries + 2 keys
    "00000000"              # frag_offset
    "0000" "0001"           # frag 0 of 1
    "0030" "0000"           # frag_len 48, reserved
) + bytes.fromhex(
    "0300" "0800" "01" "00" "0000" "01000000" "00000000"   # table 3, dim 8, fp32, 1 key (little-endian)
    "0400" "0200" "02" "00" "0000" "01000000" "00000000"   # table 4, dim 2, fp16, 1 key
) + (5).to_bytes(8, "little") + (2**40 + 1).to_bytes(8, "little")
DIRECTORY = codec.make_directory([3, 4], [8, 2], [1, 2], [1, 1])
KEYS = np.array([5, 2**40 + 1], dtype=np.uint64)


def test_header_layout_matches_consts():
    assert codec.HEADER_DTYPE.itemsize == consts.HDR_LEN == 44
    off = 0
    for (name, o, size), f in zip(consts.HEADER_FIELDS, Embnic.fields_desc):
        assert f.name == name
        assert o == off
        assert f.sz == size
        off += size
    assert off == consts.HDR_LEN
    assert set(consts.MESSAGE_FIELDS) <= {n for n, _, _ in consts.HEADER_FIELDS}
    assert [(f.name, f.sz) for f in EmbnicDirEntry.fields_desc] == [
        (n, np.dtype(t).itemsize) for n, t in consts.DIR_ENTRY_FIELDS]


def test_scapy_golden_bytes():
    body = KEYS.astype("<u8").tobytes()
    pkt = (Embnic(msg_type="LOOKUP_REQ", msg_id=7, client_id=2, shard_id=1, num_tables=2, value_len=36)
           / EmbnicDirEntry(table_id=3, dim=8, dtype=1, num_keys=1)
           / EmbnicDirEntry(table_id=4, dim=2, dtype=2, num_keys=1) / Raw(body))
    assert bytes(pkt) == GOLDEN_LOOKUP
    d = Embnic(GOLDEN_LOOKUP)  # and dissects back, directory entry by entry
    entries = [d.getlayer(EmbnicDirEntry, i) for i in (1, 2)]
    assert [(e.table_id, e.dim, e.dtype, e.num_keys) for e in entries] == [(3, 8, 1, 1), (4, 2, 2, 1)]
    assert d[Raw].load == body


def test_codec_golden_bytes():
    frames = codec.encode_lookup(msg_id=7, client_id=2, shard_id=1, directory=DIRECTORY, keys=KEYS)
    assert frames == [GOLDEN_LOOKUP]
    h = codec.parse_header(frames[0])
    assert (h.msg_type, h.msg_id, h.client_id, h.num_tables, h.num_keys, h.value_len, h.msg_len) == (
        1, 7, 2, 2, 2, 36, 48)
    rb = codec.parse_request_body(h, frames[0][consts.HDR_LEN:])
    np.testing.assert_array_equal(rb.keys, KEYS)
    assert rb.key_offsets.tolist() == [0, 1, 2] and rb.value_offsets.tolist() == [0, 32, 36]


def test_update_and_reply_sections():
    g3 = np.arange(8, dtype=np.float32)[None]
    g4 = np.array([[1.5, -2.0]], dtype=np.float32)
    values = codec.values_to_body([g3, g4], [1, 2])
    (f,) = codec.encode_update(msg_id=8, client_id=2, shard_id=1, directory=DIRECTORY, keys=KEYS, values=values)
    h = codec.parse_header(f)
    assert (h.value_len, h.msg_len) == (36, 32 + 16 + 36)
    rb = codec.parse_request_body(h, f[consts.HDR_LEN:])
    np.testing.assert_array_equal(codec.table_values(rb.values, rb, 0), g3)
    np.testing.assert_array_equal(codec.table_values(rb.values, rb, 1), g4.astype(np.float16))
    with pytest.raises(ValueError, match="values are 35 bytes, the directory says 36"):
        codec.encode_update(msg_id=8, client_id=2, shard_id=1, directory=DIRECTORY, keys=KEYS, values=values[:35])
    (r,) = codec.encode_reply(h, MsgType.LOOKUP_REPLY, shard_id=1, body=values)
    rh = codec.parse_header(r)  # a reply copies the counts: its length is the request's value_len
    assert (rh.num_tables, rh.num_keys, rh.value_len, rh.msg_len, rh.table_id) == (2, 2, 36, 36, consts.NO_TABLE)
    (e,) = codec.encode_reply(h, MsgType.ERROR, shard_id=1, status=Status.DIM_MISMATCH, table_id=4)
    eh = codec.parse_header(e)
    assert (eh.msg_len, eh.status, eh.table_id) == (0, Status.DIM_MISMATCH, 4)


@pytest.mark.parametrize("change,status,table,match", [
    (lambda d: d["table_id"].__setitem__(1, 3), Status.MALFORMED, 3, "twice"),
    (lambda d: d["dtype"].__setitem__(1, 7), Status.MALFORMED, 4, "dtype 7"),
    (lambda d: d["dim"].__setitem__(0, 0), Status.MALFORMED, 3, "dim 0"),
    (lambda d: d["num_keys"].__setitem__(0, 0), Status.MALFORMED, 3, "0 keys"),
])
def test_directory_faults_name_the_table(change, status, table, match):
    d = DIRECTORY.copy()
    change(d)
    (f,) = codec.encode_lookup(msg_id=1, client_id=1, shard_id=0, directory=DIRECTORY, keys=KEYS)
    h = codec.parse_header(f)
    body = d.tobytes() + f[consts.HDR_LEN + 32:]
    with pytest.raises(DirectoryError, match=match) as e:
        codec.parse_request_body(h, body)
    assert (e.value.status, e.value.table_id) == (status, table)


def test_directory_that_does_not_add_up_is_the_messages_fault():
    d = DIRECTORY.copy()
    d["num_keys"][1] = 2  # 3 keys where the header says 2
    (f,) = codec.encode_lookup(msg_id=1, client_id=1, shard_id=0, directory=DIRECTORY, keys=KEYS)
    with pytest.raises(DirectoryError, match="counts 3 keys, the header 2") as e:
        codec.parse_request_body(codec.parse_header(f), d.tobytes() + f[consts.HDR_LEN + 32:])
    assert e.value.table_id == consts.NO_TABLE
    d = DIRECTORY.copy()
    d["dim"][1] = 4  # 4 more value bytes than value_len
    with pytest.raises(DirectoryError, match="40 value bytes, the header 36"):
        codec.parse_request_body(codec.parse_header(f), d.tobytes() + f[consts.HDR_LEN + 32:])


def test_rdpcap_dissects(tmp_path):
    frames = codec.encode_lookup(msg_id=9, client_id=1, shard_id=0, keys=np.arange(3, dtype=np.uint64),
                                 directory=codec.make_directory([0], [4], [1], [3]))
    pkt = Ether() / IP(src="10.0.0.2", dst="10.0.0.1") / UDP(sport=40000, dport=7878) / Raw(frames[0])
    wrpcap(str(tmp_path / "t.pcap"), [pkt])
    (back,) = rdpcap(str(tmp_path / "t.pcap"))
    assert Embnic in back and EmbnicDirEntry in back
    assert back[Embnic].msg_id == 9 and back[Embnic].num_keys == 3 and back[EmbnicDirEntry].num_keys == 3
    assert "LOOKUP_REQ" in back.summary()


def test_answers():
    req = Embnic(msg_type="LOOKUP_REQ", msg_id=5, client_id=3)
    rep = Embnic(msg_type="LOOKUP_REPLY", msg_id=5, client_id=3)
    other = Embnic(msg_type="LOOKUP_REPLY", msg_id=6, client_id=3)
    ack = Embnic(msg_type="UPDATE_ACK", msg_id=5, client_id=3)
    assert rep.answers(req) and not other.answers(req) and not ack.answers(req)
    assert Embnic(msg_type="ERROR", msg_id=5, client_id=3).answers(req)


msg_strategy = st.fixed_dictionaries({
    "msg_type": st.sampled_from(list(MsgType)),
    "msg_id": st.integers(0, 2**32 - 1),
    "client_id": st.integers(0, 0xFFFF),
    "table_id": st.integers(0, 0xFFFF),
    "shard_id": st.integers(0, 0xFFFF),
    "dims": st.lists(st.integers(1, 64), min_size=1, max_size=30),
    "dtype": st.sampled_from([1, 2]),
    "keys_per_table": st.integers(1, 40),
    "flags": st.sampled_from([0, 1]),
    "status": st.sampled_from([0, 1, 4]),
    "mtu": st.sampled_from([576, 1500, 9000]),
    "seed": st.integers(0, 2**32 - 1),
})


def _message(m):
    """(header counts, body) of a valid message of the drawn type: directory, keys, values."""
    rng = np.random.default_rng(m["seed"])
    T, k = len(m["dims"]), m["keys_per_table"]
    d = codec.make_directory(rng.permutation(1000)[:T], m["dims"], [m["dtype"]] * T, [k] * T)
    n, vl = T * k, codec.value_len_of(d)
    keys = rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True)
    vals = rng.standard_normal(vl // consts.esize(m["dtype"])).astype(codec.value_dtype(m["dtype"])).tobytes()
    t = m["msg_type"]
    if t == MsgType.SIZE_REQ:
        e = np.zeros(n, codec.SIZE_ENTRY_DTYPE)
        e["msg_id"], e["num_keys"] = rng.integers(0, 2**32, n), rng.integers(1, 2**20, n)
        e["msg_type"], e["num_tables"], e["msg_len"] = MsgType.LOOKUP_REQ, 1, 16 + 8 * e["num_keys"]
        return (0, n, 0), e.tobytes()
    if t == MsgType.LOOKUP_REQ:
        return (T, n, vl), d.tobytes() + codec.keys_to_body(keys)
    if t == MsgType.LOOKUP_REPLY:
        return (T, n, vl), vals
    if t == MsgType.UPDATE_REQ:
        return (T, n, vl), d.tobytes() + codec.keys_to_body(keys) + vals
    if t == MsgType.UPDATE_NACK:
        return (T, n, vl), codec.nack_body(rng.choice(consts.MAX_FRAGS, 7, replace=False))
    return (T, n, vl), b""


@settings(max_examples=200, deadline=None)
@given(msg_strategy)
def test_codec_bytes_identical_to_scapy(m):
    (T, n, vl), body = _message(m)
    p, count = codec.frag_geometry(len(body), m["mtu"])
    kw = dict(msg_id=m["msg_id"], client_id=m["client_id"], shard_id=m["shard_id"], num_tables=T,
              table_id=m["table_id"], num_keys=n, value_len=vl, body=body, mtu=m["mtu"], flags=m["flags"],
              status=m["status"])
    if count > consts.MAX_FRAGS:  # the strategy can draw a message too large for one (30 tables x 40 x 64 at 576)
        with pytest.raises(ValueError, match=f"needs {count} fragments"):
            codec.encode_message(m["msg_type"], **kw)
        return
    frames = codec.encode_message(m["msg_type"], **kw)
    assert len(frames) == count
    joined = b""
    H = consts.HDR_LEN
    for i, f in enumerate(frames):
        h = codec.parse_header(f)  # every fragment is valid
        assert h.frag_index == i and h.frag_count == count and h.frag_offset == i * p
        assert len(f) - H <= p
        ref = Embnic(msg_type=m["msg_type"], flags=m["flags"], status=m["status"], msg_id=m["msg_id"],
                     client_id=m["client_id"], shard_id=m["shard_id"], num_tables=T, table_id=m["table_id"],
                     num_keys=n, value_len=vl, msg_len=len(body), frag_offset=h.frag_offset,
                     frag_index=i, frag_count=count) / Raw(f[H:])
        assert bytes(ref) == f
        # and Scapy dissects codec bytes to the same fields
        d = Embnic(f)
        assert all(getattr(d, name) == getattr(h, name) for name, _, _ in consts.HEADER_FIELDS if name != "flags")
        assert int(d.flags) == h.flags
        joined += f[H:]
    assert joined == body
    if m["msg_type"] in (MsgType.LOOKUP_REQ, MsgType.UPDATE_REQ):
        rb = codec.parse_request_body(codec.parse_header(frames[0]), joined)
        assert rb.key_offsets[-1] == n and rb.value_offsets[-1] == vl


def _frame(**kw):
    """A one-table lookup of 4 keys (dim 8, fp32): T 1, n 4, value_len 128, msg_len 48."""
    d = codec.make_directory([0], [8], [1], [4])
    return codec.encode_lookup(msg_id=1, client_id=1, shard_id=0, directory=d, keys=np.arange(4, dtype=np.uint64),
                               **kw)[0]


def _put(f, name, value):
    off, size = next((o, s) for n, o, s in consts.HEADER_FIELDS if n == name)
    return f[:off] + int(value).to_bytes(size, "big") + f[off + size:]


V1_LOOKUP = bytes.fromhex("454d0101" "00010000" "00000007" "00020003" "00010008" "00000001" "00000008"
                          "00000000" "00000001" "00080000") + (5).to_bytes(8, "little")


@pytest.mark.parametrize("mutate,reason", [
    (lambda f: f[:43], "too_short"),
    (lambda f: b"\x00\x00" + f[2:], "bad_magic"),
    (lambda f: _put(f, "version", 1), "bad_version"),
    (lambda f: V1_LOOKUP, "bad_version"),                           # a whole v1 frame
    (lambda f: _put(f, "msg_type", 9), "bad_type"),
    (lambda f: _put(f, "msg_type", 0), "bad_type"),
    (lambda f: f[:-1], "bad_length"),                                 # frag_len vs frame
    (lambda f: f + b"\x00", "bad_length"),
    (lambda f: _put(f, "msg_len", 999), "bad_length"),                # msg_len vs counts
    (lambda f: _put(f, "num_keys", 5), "bad_length"),                 # num_keys vs msg_len
    (lambda f: _put(f, "num_tables", 2), "bad_length"),              # num_tables vs msg_len
    (lambda f: _put(_put(f, "num_tables", 0), "msg_len", 32), "bad_length"),  # no table
    (lambda f: _put(f, "value_len", 7), "bad_length"),                # rows of less than 2 bytes
    (lambda f: _put(f, "frag_count", 0), "bad_length"),
    (lambda f: _put(f, "frag_index", 3), "bad_length"),               # index >= count
    (lambda f: _put(f, "frag_offset", 8), "bad_length"),              # offset+len > msg_len
])
def test_validation_reasons(mutate, reason):
    f = _frame()
    codec.parse_header(f)
    with pytest.raises(FrameError) as e:
        codec.parse_header(mutate(f))
    assert e.value.reason == reason
    assert reason in consts.DROP_REASONS


def test_reply_length_is_value_len():
    f = _frame()
    (r,) = codec.encode_reply(codec.parse_header(f), MsgType.LOOKUP_REPLY, shard_id=0, body=bytes(128))
    codec.parse_header(r)
    with pytest.raises(FrameError, match="bad_length"):
        codec.parse_header(_put(r, "value_len", 132))


def test_expect_direction():
    f = _frame()
    codec.parse_header(f, expect="request")
    with pytest.raises(FrameError, match="bad_type"):
        codec.parse_header(f, expect="reply")
    (ack,) = codec.encode_reply(codec.parse_header(f), MsgType.UPDATE_ACK, shard_id=0)
    codec.parse_header(ack, expect="reply")
    with pytest.raises(FrameError, match="bad_type"):
        codec.parse_header(ack, expect="request")


def test_mtu_too_small():
    with pytest.raises(ValueError, match="MTU"):
        codec.encode_message(1, msg_id=1, client_id=1, body=b"x" * 8, num_keys=1, mtu=60)


# ---- at most 256 fragments a message (docs/protocol.md, "Fragmentation") ------------------------

def test_max_frags_constant():
    assert consts.MAX_FRAGS == 256
    assert consts.max_body_per_frame(1500) == 1428


def test_more_than_256_fragments_dropped_as_too_many_frags():
    p = consts.max_body_per_frame(1500)
    n = (256 * p - 16) // 8  # the most keys of one table that fit 256 fragments
    d = codec.make_directory([0], [1], [2], [n])
    frames = codec.encode_lookup(msg_id=1, client_id=1, shard_id=0, directory=d, keys=np.zeros(n, np.uint64))
    assert len(frames) == 256  # the largest message that fits
    h = codec.parse_header(frames[0])._replace(frag_count=257, num_keys=n + 179, msg_len=16 + 8 * (n + 179),
                                               value_len=2 * (n + 179))
    with pytest.raises(FrameError) as e:
        codec.parse_header(h.pack() + frames[0][consts.HDR_LEN:])
    assert e.value.reason == "too_many_frags"


def test_encode_refuses_more_than_256_fragments():
    p = consts.max_body_per_frame(1500)
    with pytest.raises(ValueError, match="257 fragments.*max 256.*several messages"):
        codec.encode_message(MsgType.LOOKUP_REQ, msg_id=1, client_id=1, num_keys=1, body=bytes(256 * p + 1))

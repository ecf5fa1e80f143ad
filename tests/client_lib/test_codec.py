"""Protocol v1: Scapy layer golden bytes, codec ≡ Scapy (hypothesis), validation by reason.

Run alone: python3 -m pytest -q tests/client_lib/test_codec.py
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.all import IP, UDP, Ether, Raw, rdpcap, wrpcap

from embnic.client_lib import codec, consts
from embnic.client_lib.codec import FrameError
from embnic.client_lib.consts import MsgType
from embnic.client_lib.protocol import Embnic

GOLDEN_LOOKUP = bytes.fromhex(
    "454d" "01" "01"        # magic, version, LOOKUP_REQ
    "00" "01" "0000"        # flags, fp32, status
    "00000007"              # msg_id
    "0002" "0003"           # client 2, table 3
    "0001" "0008"           # shard 1, dim 8
    "00000002"              # num_keys
    "00000010"              # msg_len 16
    "00000000"              # frag_offset
    "0000" "0001"           # frag 0 of 1
    "0010" "0000"           # frag_len 16, reserved
) + (5).to_bytes(8, "little") + (2**40 + 1).to_bytes(8, "little")


def test_header_layout_matches_consts():
    assert codec.HEADER_DTYPE.itemsize == consts.HDR_LEN == 40
    off = 0
    for (name, o, size), f in zip(consts.HEADER_FIELDS, Embnic.fields_desc):
        assert f.name == name
        assert o == off
        assert f.sz == size
        off += size
    assert off == consts.HDR_LEN


def test_scapy_golden_bytes():
    body = np.array([5, 2**40 + 1], dtype="<u8").tobytes()
    pkt = Embnic(msg_type="LOOKUP_REQ", msg_id=7, client_id=2, table_id=3, shard_id=1, dim=8, dtype=1) / Raw(body)
    assert bytes(pkt) == GOLDEN_LOOKUP


def test_codec_golden_bytes():
    frames = codec.encode_lookup(msg_id=7, client_id=2, table_id=3, shard_id=1, dim=8, dtype=1,
                                 keys=np.array([5, 2**40 + 1], dtype=np.uint64))
    assert frames == [GOLDEN_LOOKUP]
    h = codec.parse_header(frames[0])
    assert (h.msg_type, h.msg_id, h.client_id, h.num_keys, h.msg_len) == (1, 7, 2, 2, 16)
    np.testing.assert_array_equal(codec.body_to_keys(frames[0][40:], 2), [5, 2**40 + 1])


def test_rdpcap_dissects(tmp_path):
    frames = codec.encode_lookup(msg_id=9, client_id=1, table_id=0, shard_id=0, dim=4, dtype=1,
                                 keys=np.arange(3, dtype=np.uint64))
    pkt = Ether() / IP(src="10.0.0.2", dst="10.0.0.1") / UDP(sport=40000, dport=7878) / Raw(frames[0])
    wrpcap(str(tmp_path / "t.pcap"), [pkt])
    (back,) = rdpcap(str(tmp_path / "t.pcap"))
    assert Embnic in back
    assert back[Embnic].msg_id == 9 and back[Embnic].num_keys == 3
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
    "dim": st.integers(1, 64),
    "dtype": st.sampled_from([1, 2]),
    "num_keys": st.integers(1, 600),
    "flags": st.sampled_from([0, 1]),
    "mtu": st.sampled_from([576, 1500, 9000]),
    "seed": st.integers(0, 2**32 - 1),
}).filter(lambda m: consts.expected_msg_len(m["msg_type"], m["num_keys"], m["dim"], m["dtype"])
          <= consts.MAX_FRAGS * consts.max_body_per_frame(m["mtu"]))  # at most 256 fragments a message


def _body(m):
    rng = np.random.default_rng(m["seed"])
    n, d = m["num_keys"], m["dim"]
    t = m["msg_type"]
    if t in (MsgType.UPDATE_ACK, MsgType.ERROR, MsgType.SIZE_ACK):
        return b""
    keys = rng.integers(0, 2**63, n, dtype=np.uint64)
    if t == MsgType.SIZE_REQ:
        e = np.zeros(n, codec.SIZE_ENTRY_DTYPE)
        e["msg_id"], e["num_keys"] = rng.integers(0, 2**32, n), rng.integers(1, 2**20, n)
        e["msg_type"], e["msg_len"] = MsgType.LOOKUP_REQ, 8 * e["num_keys"]
        return e.tobytes()
    vals = rng.standard_normal((n, d)).astype(codec.value_dtype(m["dtype"]))
    if t == MsgType.LOOKUP_REQ:
        return codec.keys_to_body(keys)
    if t == MsgType.LOOKUP_REPLY:
        return codec.rows_to_body(vals, m["dtype"])
    return codec.update_to_body(keys, vals, m["dtype"])


@settings(max_examples=200, deadline=None)
@given(msg_strategy)
def test_codec_bytes_identical_to_scapy(m):
    body = _body(m)
    frames = codec.encode_message(m["msg_type"], msg_id=m["msg_id"], client_id=m["client_id"],
                                  table_id=m["table_id"], shard_id=m["shard_id"], dim=m["dim"],
                                  dtype=m["dtype"], num_keys=m["num_keys"], body=body, mtu=m["mtu"],
                                  flags=m["flags"], status=0)
    p, count = codec.frag_geometry(len(body), m["mtu"])
    assert len(frames) == count
    joined = b""
    for i, f in enumerate(frames):
        h = codec.parse_header(f)  # every fragment is valid
        assert h.frag_index == i and h.frag_count == count and h.frag_offset == i * p
        assert len(f) - 40 <= p
        ref = Embnic(msg_type=m["msg_type"], flags=m["flags"], dtype=m["dtype"], msg_id=m["msg_id"],
                     client_id=m["client_id"], table_id=m["table_id"], shard_id=m["shard_id"], dim=m["dim"],
                     num_keys=m["num_keys"], msg_len=len(body), frag_offset=h.frag_offset,
                     frag_index=i, frag_count=count) / Raw(f[40:])
        assert bytes(ref) == f
        # and Scapy dissects codec bytes to the same fields
        d = Embnic(f)
        assert (d.msg_id, d.num_keys, d.frag_len) == (m["msg_id"], m["num_keys"], len(f) - 40)
        joined += f[40:]
    assert joined == body


def _frame(**kw):
    kw.setdefault("body", np.arange(4, dtype="<u8").tobytes())
    kw.setdefault("num_keys", 4)
    t = kw.pop("msg_type", MsgType.LOOKUP_REQ)
    return codec.encode_message(t, msg_id=1, client_id=1, dim=8, **kw)[0]


@pytest.mark.parametrize("mutate,reason", [
    (lambda f: f[:39], "too_short"),
    (lambda f: b"\x00\x00" + f[2:], "bad_magic"),
    (lambda f: f[:2] + b"\x02" + f[3:], "bad_version"),
    (lambda f: f[:3] + b"\x09" + f[4:], "bad_type"),
    (lambda f: f[:3] + b"\x00" + f[4:], "bad_type"),
    (lambda f: f[:5] + b"\x07" + f[6:], "bad_dtype"),
    (lambda f: f[:-1], "bad_length"),                                 # frag_len vs frame
    (lambda f: f + b"\x00", "bad_length"),
    (lambda f: f[:24] + (999).to_bytes(4, "big") + f[28:], "bad_length"),  # msg_len vs keys
    (lambda f: f[:20] + (5).to_bytes(4, "big") + f[24:], "bad_length"),    # num_keys vs msg_len
    (lambda f: f[:34] + (0).to_bytes(2, "big") + f[36:], "bad_length"),    # frag_count 0
    (lambda f: f[:32] + (3).to_bytes(2, "big") + f[34:], "bad_length"),    # index >= count
    (lambda f: f[:28] + (8).to_bytes(4, "big") + f[32:], "bad_length"),    # offset+len > msg_len
])
def test_validation_reasons(mutate, reason):
    f = _frame()
    codec.parse_header(f)
    with pytest.raises(FrameError) as e:
        codec.parse_header(mutate(f))
    assert e.value.reason == reason
    assert reason in consts.DROP_REASONS


def test_expect_direction():
    f = _frame()
    codec.parse_header(f, expect="request")
    with pytest.raises(FrameError, match="bad_type"):
        codec.parse_header(f, expect="reply")
    ack = _frame(msg_type=MsgType.UPDATE_ACK, body=b"")
    codec.parse_header(ack, expect="reply")
    with pytest.raises(FrameError, match="bad_type"):
        codec.parse_header(ack, expect="request")


def test_lookup_reply_zero_dtype_rejected():
    f = _frame(msg_type=MsgType.LOOKUP_REPLY, dtype=0, body=b"")
    with pytest.raises(FrameError) as e:
        codec.parse_header(f)
    assert e.value.reason == "bad_dtype"


def test_mtu_too_small():
    with pytest.raises(ValueError, match="MTU"):
        codec.encode_message(1, msg_id=1, client_id=1, body=b"x" * 8, num_keys=1, mtu=60)


# ---- at most 256 fragments a message (docs/protocol.md, "Fragmentation") ------------------------

def test_max_frags_constant():
    assert consts.MAX_FRAGS == 256


def test_more_than_256_fragments_dropped_as_too_many_frags():
    p = consts.max_body_per_frame(1500)
    n = 256 * p // 8 + 1  # 45825 keys: 257 fragments
    frames = codec.encode_message(MsgType.LOOKUP_REQ, msg_id=1, client_id=1, num_keys=n - 1, dim=4,
                                  body=bytes(8 * (n - 1)), mtu=1500)
    assert len(frames) == 256  # the largest message that fits
    h = codec.parse_header(frames[0])._replace(frag_count=257, num_keys=n, msg_len=8 * n)
    with pytest.raises(FrameError) as e:
        codec.parse_header(h.pack() + frames[0][consts.HDR_LEN:])
    assert e.value.reason == "too_many_frags"


def test_encode_refuses_more_than_256_fragments():
    p = consts.max_body_per_frame(1500)
    with pytest.raises(ValueError, match="257 fragments.*max 256.*several messages"):
        codec.encode_message(MsgType.LOOKUP_REQ, msg_id=1, client_id=1, num_keys=1, body=bytes(256 * p + 1))


@pytest.mark.parametrize("msg_type,dim,dtype,mtu,want", [
    (MsgType.LOOKUP_REQ, 64, 1, 1500, 256 * 1432 // 256),     # the reply bounds it: 1432
    (MsgType.UPDATE_REQ, 64, 1, 1500, 256 * 1432 // 264),     # 1388
    (MsgType.LOOKUP_REQ, 1, 2, 1500, 256 * 1432 // 8),        # the request bounds it: 45824
    (MsgType.LOOKUP_REQ, 512, 1, 9000, 256 * 8932 // 2048),
])
def test_max_keys_per_message(msg_type, dim, dtype, mtu, want):
    k = consts.max_keys_per_message(msg_type, dim, dtype, mtu)
    assert k == want
    p = consts.max_body_per_frame(mtu)
    for t in (msg_type, MsgType.LOOKUP_REPLY if msg_type == MsgType.LOOKUP_REQ else MsgType.UPDATE_ACK):
        assert consts.expected_msg_len(t, k, dim, dtype) <= consts.MAX_FRAGS * p          # k fits ...
    assert max(consts.expected_msg_len(t, k + 1, dim, dtype) for t in (
        msg_type, MsgType.LOOKUP_REPLY)) > consts.MAX_FRAGS * p or msg_type == MsgType.UPDATE_REQ  # ... k+1 not
    with pytest.raises(ValueError):
        consts.max_keys_per_message(MsgType.LOOKUP_REPLY, dim, dtype, mtu)

"""What of the client library only tests use: encoders and decoders of the codec (the production
paths build frames in C, client_lib/csrc/) — a SIZE_REQ, a one-table UPDATE_REQ, a body's keys or
rows, an UPDATE_NACK's bitmap —, every key of a table a shard owns (:func:`owned_keys`) and the C
plan of a round without its checks (:func:`c_plan`). Not a test file; tests/conftest.py puts this
folder on ``sys.path``.
"""
from __future__ import annotations

import numpy as np

from embnic.client_lib import codec, consts, native, routing
from embnic.client_lib.config import ClusterConfig
from embnic.client_lib.consts import DType, MsgType
from embnic.client_lib.roundplan import RoundPlan, TableArrays


def body_to_keys(body: bytes | memoryview, num_keys: int, offset: int = 0) -> np.ndarray:
    """``num_keys`` keys at byte ``offset`` of a body → uint64 (num_keys,) (a read-only view)."""
    return np.frombuffer(body, dtype=codec.KEY_DTYPE, count=num_keys, offset=offset)


def body_to_rows(body: bytes | memoryview, num_keys: int, dim: int, dtype: int = DType.FP32,
                 offset: int = 0) -> np.ndarray:
    """``num_keys`` rows of ``dim`` values at byte ``offset`` of a body → (num_keys, dim) of the
    wire dtype (a view, no copy)."""
    return np.frombuffer(body, dtype=codec.value_dtype(dtype), count=num_keys * dim,
                         offset=offset).reshape(num_keys, dim)


def encode_table_update(*, msg_id: int, client_id: int, shard_id: int, table_id: int, dtype: int,
                        keys: np.ndarray, grads: np.ndarray, mtu: int = consts.DEFAULT_MTU,
                        flags: int = 0) -> list[bytes]:
    """UDP payloads of an UPDATE_REQ of one table: ``keys`` uint64 (n,), ``grads`` (n, dim) —
    :func:`codec.encode_update` with a one-entry directory."""
    return codec.encode_update(msg_id=msg_id, client_id=client_id, shard_id=shard_id, keys=keys, mtu=mtu,
                               flags=flags, values=codec.rows_to_body(grads, dtype),
                               directory=codec.make_directory([table_id], [grads.shape[1]], [dtype], [len(keys)]))


def encode_size(*, msg_id: int, client_id: int, shard_id: int, entries: np.ndarray,
                mtu: int = consts.DEFAULT_MTU, flags: int = 0) -> list[bytes]:
    """UDP payloads of a SIZE_REQ announcing ``entries`` (:data:`codec.SIZE_ENTRY_DTYPE` (E,), E ≥ 1:
    ``msg_id``, ``msg_type``, ``num_tables``, ``num_keys``, ``msg_len`` of every data message that
    follows to ``shard_id``). ``num_tables`` 0 and ``value_len`` 0 in the header.

    Raises:
        ValueError: ``entries`` is empty or not of :data:`codec.SIZE_ENTRY_DTYPE`.
    """
    entries = np.asarray(entries)
    if entries.dtype != codec.SIZE_ENTRY_DTYPE or entries.ndim != 1 or len(entries) == 0:
        raise ValueError(f"SIZE_REQ entries must be a non-empty 1-D array of {codec.SIZE_ENTRY_DTYPE}")
    return codec.encode_message(MsgType.SIZE_REQ, msg_id=msg_id, client_id=client_id, shard_id=shard_id,
                                num_keys=len(entries), body=entries.tobytes(), mtu=mtu, flags=flags)


def c_plan(ta: TableArrays, msg_type: int, tix: np.ndarray, counts: np.ndarray, keys: np.ndarray, *,
           mtu: int, msg_frames: int | None, window_frames: int) -> RoundPlan:
    """:func:`native.prepare` of a round given as ``tix`` (indices into ``ta``), ``counts`` and
    ``keys``, with no gradients (zeros: the plan does not depend on them) and no checks but the
    tables', in its own workspace: the production cut of a round, as the tests compare it with
    the numpy oracle and with the capacity planner's counts (``control/traffic.py``).

    Raises:
        ValueError: a round :func:`native.prepare` refuses.
    """
    counts = np.ascontiguousarray(counts, np.int64)
    grads = None
    if msg_type != MsgType.LOOKUP_REQ:
        grads = np.zeros(int((ta.dim[tix] * counts).sum()), np.float32)
    p = native.prepare(native.load(), ta, native.Workspace(), msg_type, np.ascontiguousarray(ta.ids[tix], np.int64),
                       counts, np.ascontiguousarray(keys, np.uint64), grads, mtu=mtu, msg_frames=msg_frames,
                       window_frames=window_frames, next_id=1, trusted=True)
    if p is None:
        raise ValueError("the C plan refused the round")
    p.tix = np.ascontiguousarray(tix, np.int64)
    return p


def nack_held(body: bytes | memoryview, frag_count: int) -> np.ndarray:
    """An UPDATE_NACK body → bool (frag_count,): which fragments of the update the shard holds."""
    return np.unpackbits(np.frombuffer(body, np.uint8, consts.NACK_LEN), bitorder="little")[:frag_count].astype(bool)


def owned_keys(cfg: ClusterConfig, table_id: int, shard_id: int) -> np.ndarray:
    """Sorted uint64 array of every key of ``table_id`` that ``shard_id`` owns.

    Materialises ``rows`` ids of the table (8 bytes each) to test them; for very large tables
    prefer :func:`~embnic.client_lib.routing.owns` on the keys at hand.

    Raises:
        ValueError: the table has no ``rows`` (its ids are all of uint64).
    """
    rows = cfg.table(table_id).rows
    if rows is None:
        raise ValueError(f"table {table_id} has no rows bound (any uint64 id): list its keys with owns() "
                         "on the ids at hand")
    keys = np.arange(rows, dtype=np.uint64)
    return keys[routing.shard_of(cfg, table_id, keys) == shard_id]

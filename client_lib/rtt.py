"""The bounds of the client transport's timers (RFC 6298): the defaults the C round starts from
(``client_lib/csrc/``, ``EC_REO_WND_MIN``) and the check of a client's RTO bounds. The estimator
itself (SRTT, RTTVAR, RTO per shard and request type) runs in the C round."""
from __future__ import annotations

DEFAULT_RTO_MIN_MS = 50.0  #: lower bound of the retransmission timeout, ms
DEFAULT_RTO_MAX_MS = 10_000.0  #: upper bound of the retransmission timeout (after backoff), ms
REO_WND_MIN_MS = 1.0  #: least reordering window of the loss detection, ms


def rto_bounds_s(rto_min_ms: float, rto_max_ms: float) -> tuple[float, float]:
    """The RTO bounds in seconds, ``(min, max)``.

    Raises:
        ValueError: unless ``0 < min <= max``.
    """
    lo, hi = float(rto_min_ms) / 1000.0, float(rto_max_ms) / 1000.0
    if not 0 < lo <= hi:
        raise ValueError(f"RTO bounds must satisfy 0 < min <= max, got {lo}, {hi}")
    return lo, hi

"""Round-trip time and retransmission timeout of the client transport (RFC 6298), and its bounds."""
from __future__ import annotations

DEFAULT_RTO_MIN_MS = 50.0  #: lower bound of the retransmission timeout, ms
DEFAULT_RTO_MAX_MS = 10_000.0  #: upper bound of the retransmission timeout (after backoff), ms
REO_WND_MIN_MS = 1.0  #: least reordering window of the loss detection, ms


class RttEstimator:
    """Round-trip time and retransmission timeout of one shard (RFC 6298, section 2).

    Args:
        rto_init_s: RTO before the first sample (s).
        rto_min_s, rto_max_s: bounds of the RTO (s).

    The first sample R sets ``SRTT = R``, ``RTTVAR = R/2``; later ones
    ``RTTVAR = 3/4·RTTVAR + 1/4·|SRTT − R|``, ``SRTT = 7/8·SRTT + 1/8·R``; then
    ``RTO = SRTT + max(G, 4·RTTVAR)`` (G: 1 µs) clamped to ``[rto_min_s, rto_max_s]``.
    Backoff (section 5.5) is per message: the client doubles a message's own timer each
    time it fires.

    Example: samples 2 ms then 4 ms → SRTT 2.25 ms, RTTVAR 1.25 ms, RTO 7.25 ms (50 ms with the
    default floor).
    """

    ALPHA, BETA, K, G = 0.125, 0.25, 4.0, 1e-6

    def __init__(self, rto_init_s: float, rto_min_s: float, rto_max_s: float):
        if not 0 < rto_min_s <= rto_max_s:
            raise ValueError(f"RTO bounds must satisfy 0 < min <= max, got {rto_min_s}, {rto_max_s}")
        self.rto_min, self.rto_max = float(rto_min_s), float(rto_max_s)
        self.srtt: float | None = None
        self.min_rtt: float | None = None
        self.rttvar = 0.0
        self.rto = min(max(float(rto_init_s), self.rto_min), self.rto_max)
        self.samples = 0

    def sample(self, r: float) -> None:
        """Take one RTT measurement ``r`` (s) of a message sent once (Karn's rule is the caller's)."""
        self.min_rtt = r if self.min_rtt is None else min(self.min_rtt, r)
        if self.srtt is None:
            self.srtt, self.rttvar = r, r / 2
        else:
            self.rttvar = (1 - self.BETA) * self.rttvar + self.BETA * abs(self.srtt - r)
            self.srtt = (1 - self.ALPHA) * self.srtt + self.ALPHA * r
        self.samples += 1
        self.rto = min(max(self.srtt + max(self.G, self.K * self.rttvar), self.rto_min), self.rto_max)

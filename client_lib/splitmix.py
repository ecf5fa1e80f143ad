"""SplitMix64, the one 64-bit mixing function of embnic (routing of ids to shards, row init,
Criteo feature hashing all call this one definition).

Steele, Lea & Flood, "Fast splittable pseudorandom number generators" (OOPSLA 2014); constants
from Vigna's reference ``splitmix64.c`` (https://prng.di.unimi.it/splitmix64.c). It spreads
sequential and hashed ids evenly and takes any uint64.
"""
from __future__ import annotations

import numpy as np

GAMMA = np.uint64(0x9E3779B97F4A7C15)  #: the golden-ratio increment
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 output for state ``x``: ``mix(x + 0x9E3779B97F4A7C15)``, element-wise.

    ``mix(z)``: ``z ^= z >> 30; z *= 0xBF58476D1CE4E5B9; z ^= z >> 27; z *= 0x94D049BB133111EB;
    z ^= z >> 31`` (all mod 2^64). Equals ``next()`` of Vigna's ``splitmix64.c`` started from
    state ``x``: ``splitmix64(np.array([0], np.uint64))`` is ``[0xE220A8397B1DCDAF]``.

    Args:
        x: uint64 array of any shape (other non-negative integer arrays are converted; a
            Python int list must hold values in 0..2^64-1).

    Returns:
        uint64 array, same shape (wrapping arithmetic, no overflow warnings).
    """
    z = np.asarray(x, dtype=np.uint64) + GAMMA
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


def u64(v: int) -> np.ndarray:
    """A Python int, wrapped mod 2^64, as a uint64 (1,) array (no float round trip)."""
    return np.array([int(v) & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64)

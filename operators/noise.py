"""Keyed, addressable noise: ChaCha20 keystreams turned into integer (discrete Laplace) noise.

Every random number that protects privacy comes from here. A stream owns a 256-bit secret key; a draw is
addressed by a *domain* (what the noise is for, e.g. hierarchy layer ``j``) and an *address* (e.g. the tree
index), and by the position of the sample inside that keystream. The same key and address always give the same
noise, so re-running the same ticks reproduces the same releases bit for bit and a restart never spends privacy
budget twice (``../shared/DESIGN.md``, "Noise and secrets").

Samples are drawn in bulk (one cipher call per contiguous range) and turned into integers by vectorized numpy.

Discrete Laplace (two-sided geometric) with parameter ``a = exp(-eps / sensitivity)``, sensitivity in quantized
units::

    P(X = k) = (1 - a) / (1 + a) * a^|k|,      Var[X] = 2a / (1 - a)^2.

One 64-bit word gives one sample: the top bit is the sign, 53 of the remaining bits a uniform ``U`` in (0, 1),
and ``|X| = floor(log(U (1 + a) / 2) / log a)``, the inverse of ``P(|X| >= k) = 2 a^k / (1 + a)`` for ``k >= 1``.
The uniform's resolution (2^-54) cuts the tail at about 37 noise scales, an event of probability below 2^-53.

Examples
--------
>>> gen = KeyedGenerator(bytes(range(32)))
>>> x = gen.discrete_laplace(Domain.HIERARCHY, address=0, start=0, count=5, a=0.5)
>>> x.dtype, len(x)
(dtype('int64'), 5)
>>> bool((x == gen.discrete_laplace(Domain.HIERARCHY, 0, 0, 5, 0.5)).all())   # addressable: same draw again
True
>>> bool((x[2:] == gen.discrete_laplace(Domain.HIERARCHY, 0, 2, 3, 0.5)).all())  # any sub-range
True
"""

from __future__ import annotations

import enum
import math
import os

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

__all__ = [
    "KEY_BYTES",
    "Domain",
    "KeyedGenerator",
    "discrete_laplace_parameter",
    "discrete_laplace_variance",
    "new_key",
]

KEY_BYTES = 32
_WORDS_PER_BLOCK = 8  # a ChaCha20 block is 64 bytes
_MAX_BLOCKS = 1 << 32  # 32-bit block counter in the nonce
_U53 = 2.0**-53


class Domain(enum.IntEnum):
    """What a keystream is for; the high part of the 32-bit domain field of the nonce."""

    HIERARCHY = 1  # node noise of the perturber; low 16 bits carry the layer
    THRESHOLD = 2  # report-noisy-max noise of the threshold optimizer
    LOCAL = 3  # randomizers of the local-DP mode
    BASELINE = 4  # baselines and audits


def new_key() -> bytes:
    """A fresh 256-bit stream key from the operating system's CSPRNG."""
    return os.urandom(KEY_BYTES)


def discrete_laplace_parameter(epsilon: float, sensitivity: float) -> float:
    """``a = exp(-epsilon / sensitivity)`` of the discrete Laplace that is ``epsilon``-DP for that sensitivity."""
    if epsilon <= 0 or sensitivity <= 0:
        msg = "epsilon and sensitivity must be positive"
        raise ValueError(msg)
    return math.exp(-epsilon / sensitivity)


def discrete_laplace_variance(a: float) -> float:
    """``2a / (1 - a)^2``, the variance of the discrete Laplace with parameter ``a``."""
    return 2.0 * a / (1.0 - a) ** 2


_MASK53 = np.uint64((1 << 53) - 1)


def _words_to_discrete_laplace(words: np.ndarray, a: float) -> np.ndarray:
    """One discrete Laplace sample per 64-bit word (vectorized; see the module docstring)."""
    u = (((words >> np.uint64(10)) & _MASK53).astype(np.float64) + 0.5) * _U53
    k = np.floor(np.log(u * (0.5 * (1.0 + a))) / math.log(a)).astype(np.int64)
    return np.where((words >> np.uint64(63)) != 0, -k, k)


def _words_to_uniform(words: np.ndarray) -> np.ndarray:
    """Uniforms in (0, 1) with 53 random bits, never 0 or 1."""
    return ((words >> np.uint64(11)).astype(np.float64) + 0.5) * _U53


class KeyedGenerator:
    """ChaCha20 keyed by a 256-bit stream secret; draws are addressed, never sequential state.

    The 16-byte ChaCha20 nonce of the ``cryptography`` package is a 4-byte little-endian block counter followed
    by 12 bytes that we fill with the domain (4 bytes) and the address (8 bytes). Sample ``i`` of an address is
    the 64-bit word ``i`` of that keystream.
    """

    __slots__ = ("_key",)

    def __init__(self, key: bytes) -> None:
        if not isinstance(key, bytes | bytearray) or len(key) != KEY_BYTES:
            msg = f"a stream key is {KEY_BYTES} bytes"
            raise ValueError(msg)
        self._key = bytes(key)

    def __repr__(self) -> str:  # never print the key
        return "KeyedGenerator(<secret>)"

    def __reduce__(self):  # a generator must not be pickled into a checkpoint by accident
        msg = "KeyedGenerator holds a secret and is not picklable"
        raise TypeError(msg)

    def words(self, domain: int, address: int, start: int, count: int) -> np.ndarray:
        """The 64-bit words ``[start, start + count)`` of the keystream of ``(domain, address)``."""
        if count <= 0:
            return np.empty(0, dtype=np.uint64)
        if start < 0 or not 0 <= domain < 1 << 32 or not 0 <= address < 1 << 64:
            msg = "noise address out of range"
            raise ValueError(msg)
        block0, skip = divmod(start, _WORDS_PER_BLOCK)
        nblocks = -(-(skip + count) // _WORDS_PER_BLOCK)
        if block0 + nblocks > _MAX_BLOCKS:
            msg = "noise address out of range"
            raise ValueError(msg)
        nonce = (
            block0.to_bytes(4, "little")
            + int(domain).to_bytes(4, "little")
            + int(address).to_bytes(8, "little")
        )
        enc = Cipher(algorithms.ChaCha20(self._key, nonce), mode=None).encryptor()
        stream = enc.update(bytes(nblocks * 64))
        return np.frombuffer(stream, dtype="<u8")[skip : skip + count].astype(np.uint64, copy=False)

    def uniforms(self, domain: int, address: int, start: int, count: int) -> np.ndarray:
        """Uniform floats in (0, 1) with 53 random bits each (never exactly 0 or 1)."""
        return _words_to_uniform(self.words(domain, address, start, count))

    def discrete_laplace(self, domain: int, address: int, start: int, count: int, a: float) -> np.ndarray:
        """Integer discrete Laplace samples with parameter ``a`` (see the module docstring)."""
        if not 0.0 < a < 1.0:
            msg = "discrete Laplace parameter a must be in (0, 1)"
            raise ValueError(msg)
        return _words_to_discrete_laplace(self.words(domain, address, start, count), a)

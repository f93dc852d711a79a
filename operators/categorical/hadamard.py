"""The one-bit Hadamard mechanism (HM) and Hadamard Response (HR), decoded by the fast Walsh-Hadamard transform.

Sylvester matrix ``H_K`` (``K = 2^m``): ``H[i, j] = (-1)^popcount(i & j)``, entries +-1, ``H H^T = K I``; row 0 is all
ones and every other row sums to 0. The FWHT computes ``H v`` in ``O(K log K)`` (Finnegan, thesis 2024, section 3.4; the
thesis's ``O(m log m)`` is erratum 10).

**HM** (Bassily et al. 2017; the mechanism the thesis analyses): category ``x`` owns row ``x + 1`` of ``H_K``,
``K = 2^ceil(log2(d + 1))`` (no hash: the transform is cheap up to ``2^26`` cells). A device picks a column ``l``
uniformly and sends ``(l, s H[x + 1, l])`` where ``s = +1`` with ``p = e^eps / (e^eps + 1)``, else -1 (two inputs give
the same ``l`` and their bits differ in law by ``p / (1 - p) = e^eps``). Server: ``T[l]`` = sum of the bits sent at
``l``; ``c_hat_y = (e^eps + 1) / (e^eps - 1) (H T)[y + 1]``, unbiased, ``Var = n ((e^eps + 1) / (e^eps - 1))^2 - c_y``
(``p* = e^eps / (e^eps + 1)``, ``q* = 1/2``, f-term coefficient -1; Finnegan, table 12.1).

**HR** (Acharya, Sun, Zhang 2019, the general-privacy form): the domain is cut into ``B`` blocks of ``b - 1``
categories (``b = 2^j``); category ``x`` in block ``beta`` owns row ``i = x mod (b - 1) + 1`` of ``H_b`` and the set
``S_x = {(beta, j) : H_b[i, j] = +1}`` (``b/2`` outputs). A device outputs one of the ``B b`` pairs with probability
``e^eps / Z`` on ``S_x`` and ``1 / Z`` elsewhere, ``Z = (b/2) e^eps + B b - b/2`` (ratio ``e^eps``: eps-LDP). With
``N_beta`` the histogram of block ``beta``'s outputs, ``E[(H_b N_beta)[i]] = c_y (b/2)(e^eps - 1) / Z`` (rows other
than 0 cancel every other user), so::

    c_hat_y = 2 Z / (b (e^eps - 1)) (H_b N_beta)[i]                                   (unbiased)
    Var[c_hat_y] = 2 (e^eps + 2B - 1)(n + m_beta (e^eps - 1) / 2) / (e^eps - 1)^2 - c_y

with ``m_beta`` the users in ``y``'s block. ``B = 1`` is HM's variance; many small blocks cost ``2B`` in the first
factor, few large ones ``m_beta``; :func:`hr_block_size` picks ``b`` for an even spread (``m_beta = n / B``), where
the variance is about twice OUE's at ``B = e^eps / 2``. Decoding: one FWHT per block, ``O(B b log b)``.

>>> sylvester(2)
array([[ 1,  1,  1,  1],
       [ 1, -1,  1, -1],
       [ 1,  1, -1, -1],
       [ 1, -1, -1,  1]])
>>> v = np.arange(8.0)
>>> bool(np.allclose(fwht(v.copy()), sylvester(3) @ v))
True
>>> hr_block_size(5.0, 9_796_900)
131072
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from operators.categorical._common import as_categories, check_domain, check_epsilon, uniform_index

__all__ = [
    "fwht",
    "hm_estimate",
    "hm_perturb",
    "hm_size",
    "hm_tally",
    "hm_variance",
    "hr_block_size",
    "hr_estimate",
    "hr_layout",
    "hr_perturb",
    "hr_variance",
    "sylvester",
]

MAX_TRANSFORM = 1 << 26


def sylvester(m: int) -> np.ndarray:
    """``H_{2^m}`` as an int64 matrix (tests and doctests; the mechanisms never build it)."""
    i = np.arange(1 << m)
    return np.where(np.bitwise_count(i[:, None] & i[None, :]) % 2 == 0, 1, -1).astype(np.int64)


def fwht(x: np.ndarray) -> np.ndarray:
    """``H x`` in place (float64 of length ``2^m``), unnormalised."""
    from operators.categorical._kernels import fwht as kernel

    if x.dtype != np.float64 or x.ndim != 1 or x.size & (x.size - 1):
        msg = "fwht needs a 1-D float64 vector of length 2^m"
        raise ValueError(msg)
    return kernel(x)


def _parity(v: np.ndarray) -> np.ndarray:
    return (np.bitwise_count(v.astype(np.uint64)) & 1).astype(np.int64)


# -- HM ----------------------------------------------------------------------------------------------------------
def hm_size(d: int) -> int:
    """``K = 2^ceil(log2(d + 1))``: rows 1..d of ``H_K`` are the categories."""
    d = check_domain(d, low=1)
    k = 1 << (d).bit_length()
    if k > MAX_TRANSFORM:
        msg = f"HM needs d + 1 <= 2^26 (got {d})"
        raise ValueError(msg)
    return k


def hm_perturb(values: Any, d: int, epsilon: float, u: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(l, bit)`` per value from two uniforms (``u[0::2]`` column, ``u[1::2]`` keep or flip); bits are +-1."""
    eps = check_epsilon(epsilon)
    k = hm_size(d)
    x = as_categories(values, d)
    us = np.asarray(u, dtype=np.float64).reshape(-1)
    if us.size != 2 * x.size:
        msg = "hm_perturb needs two uniforms per value"
        raise ValueError(msg)
    col = uniform_index(us[0::2], k)
    true_bit = 1 - 2 * _parity((x + 1) & col)
    keep = us[1::2] < math.exp(eps) / (math.exp(eps) + 1.0)
    return col, np.where(keep, true_bit, -true_bit)


def hm_tally(columns: Any, bits: Any, d: int) -> np.ndarray:
    """``T[l]`` = sum of the +-1 bits reported at column ``l`` (length ``K``)."""
    return np.bincount(np.asarray(columns, dtype=np.int64), weights=np.asarray(bits, dtype=np.float64),
                       minlength=hm_size(d))


def hm_estimate(tally: Any, d: int, epsilon: float) -> np.ndarray:
    """``(e^eps + 1) / (e^eps - 1) (H T)[1 : d + 1]`` (one FWHT)."""
    e = math.exp(check_epsilon(epsilon))
    t = np.array(tally, dtype=np.float64)
    return fwht(t)[1 : d + 1] * ((e + 1.0) / (e - 1.0))


def hm_variance(n: int, epsilon: float, counts: Any = 0.0) -> Any:
    """``n ((e^eps + 1) / (e^eps - 1))^2 - c_y``."""
    e = math.exp(check_epsilon(epsilon))
    return n * ((e + 1.0) / (e - 1.0)) ** 2 - np.asarray(counts, dtype=np.float64)


# -- HR ----------------------------------------------------------------------------------------------------------
def _hr_var_even(e: float, blocks: int) -> float:
    return 2.0 * (e + 2 * blocks - 1) * (1.0 + (e - 1.0) / (2.0 * blocks)) / (e - 1.0) ** 2


def hr_block_size(epsilon: float, d: int) -> int:
    """The block size ``b = 2^j`` of least variance for an even spread of users over the blocks."""
    e = math.exp(check_epsilon(epsilon))
    d = check_domain(d)
    best = None
    b = 2
    while True:
        blocks = -(-d // (b - 1))
        key = (_hr_var_even(e, blocks), b)
        if best is None or key < best:
            best = key
        if blocks == 1 or b >= MAX_TRANSFORM:
            break
        b *= 2
    return best[1]


def hr_layout(epsilon: float, d: int, b: int | None = None) -> tuple[int, int, float]:
    """``(b, B, Z)``: block size, number of blocks and the normaliser ``Z = (b/2) e^eps + B b - b/2``."""
    e = math.exp(check_epsilon(epsilon))
    d = check_domain(d)
    if b is None:
        b = hr_block_size(epsilon, d)
    if isinstance(b, bool) or not isinstance(b, int) or b < 2 or b & (b - 1) or b > MAX_TRANSFORM:
        msg = f"HR block size must be a power of 2 in [2, 2^26] (got {b!r})"
        raise ValueError(msg)
    blocks = -(-d // (b - 1))
    return b, blocks, (b / 2) * e + blocks * b - b / 2


def hr_perturb(values: Any, d: int, epsilon: float, u: Any, b: int | None = None) -> np.ndarray:
    """HR outputs as flat indices ``beta b + j`` in ``[0, B b)``, from two uniforms per value (``u[0::2]`` which of
    {own set, own block outside the set, another block}, ``u[1::2]`` which output in it)."""
    e = math.exp(check_epsilon(epsilon))
    b, blocks, z = hr_layout(epsilon, d, b)
    x = as_categories(values, d)
    us = np.asarray(u, dtype=np.float64).reshape(-1)
    if us.size != 2 * x.size:
        msg = "hr_perturb needs two uniforms per value"
        raise ValueError(msg)
    beta, row = np.divmod(x, b - 1)
    row += 1
    t_in = (b / 2) * e / z
    t_own = t_in + (b / 2) / z
    u0, u1 = us[0::2], us[1::2]
    # own block: a uniform column, moved into the wanted parity class by flipping the lowest set bit of the row
    col = uniform_index(u1, b)
    want = (u0 >= t_in).astype(np.int64)  # 0: in S_x (even parity), 1: own block outside S_x
    col = np.where(_parity(row & col) != want, col ^ (row & -row), col)
    own = beta * b + col
    if blocks == 1:
        return own
    other = uniform_index(u1, (blocks - 1) * b)
    ob, oj = np.divmod(other, b)
    ob += ob >= beta
    return np.where(u0 < t_own, own, ob * b + oj)


def hr_estimate(outputs: Any, d: int, epsilon: float, b: int | None = None) -> np.ndarray:
    """Unbiased counts ``2 Z / (b (e^eps - 1)) (H_b N_beta)[i]`` for every category (one FWHT per block)."""
    e = math.exp(check_epsilon(epsilon))
    b, blocks, z = hr_layout(epsilon, d, b)
    hist = np.bincount(np.asarray(outputs, dtype=np.int64), minlength=blocks * b).astype(np.float64)
    if hist.size != blocks * b:
        msg = "HR outputs must be in [0, B b)"
        raise ValueError(msg)
    from operators.categorical._kernels import fwht_rows

    rows = fwht_rows(hist.reshape(blocks, b))
    est = rows[:, 1:].reshape(-1)[:d]
    return est * (2.0 * z / (b * (e - 1.0)))


def hr_variance(n: int, d: int, epsilon: float, counts: Any, b: int | None = None) -> np.ndarray:
    """``2 (e^eps + 2B - 1)(n + m_beta (e^eps - 1) / 2) / (e^eps - 1)^2 - c_y`` for every category (``counts`` is
    the true histogram, which gives each block's mass ``m_beta``)."""
    e = math.exp(check_epsilon(epsilon))
    b, blocks, _ = hr_layout(epsilon, d, b)
    c = np.asarray(counts, dtype=np.float64)
    padded = np.zeros(blocks * (b - 1))
    padded[:d] = c
    mass = np.repeat(padded.reshape(blocks, b - 1).sum(axis=1), b - 1)[:d]
    return 2.0 * (e + 2 * blocks - 1) * (n + mass * (e - 1.0) / 2.0) / (e - 1.0) ** 2 - c

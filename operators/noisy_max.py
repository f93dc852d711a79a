"""Report-noisy-max with exponential noise, its noise drawn where it can matter: a few draws instead of one a candidate.

Report-noisy-max (Wang et al., CCS 2021, Section 3.2, NM-E; :func:`operators.threshold.report_noisy_max`) adds
independent ``Exp(eps)`` noise ``E_k = -log(U_k) / eps`` to every candidate's score ``u_k`` and reports the index of the
largest ``u_k + E_k``: ``eps``-DP for scores of sensitivity 1 that move the same way (the holdout's counts). Drawing a
uniform for each of 4,296 candidates (the exact grid at B = 5,000) reads 34 KB of keystream a holdout,
though the winner is nearly always one of a few candidates: those with the largest noise, or those with the largest
scores.

The same distribution, drawn in two parts (the noises are independent, so any split of the candidates made before
drawing keeps their joint law):

* **Near the top.** The candidates within ``(log n + 2) / eps`` of the largest score ``u*``, when there are at most
  64 of them, get a uniform each (in index order). Where they are more, none is treated apart.
* **The others, from the largest noise down.** The order statistics ``U_(1) < U_(2) < ...`` of the other ``n'``
  uniforms are a Markov chain (Renyi's representation; Devroye, *Non-Uniform Random Variate Generation*, 1986, V.3):
  given ``U_(j)``, the remaining ``n' - j`` are independent and uniform on ``(U_(j), 1)``, so::

      1 - U_(j+1) = (1 - U_(j)) * V_(j+1) ** (1 / (n' - j)),    V_(j+1) uniform on (0, 1)

  kept as ``L_j = log(1 - U_(j))`` (``L_j = L_(j-1) + log(V_j) / (n' - j + 1)``, ``U_(j) = -expm1(L_j)``: no
  cancellation when ``U`` is small), and ``U_(j)`` goes to a candidate drawn uniformly among the ``n' - j + 1`` not
  yet given one (every assignment of the order statistics to the candidates is equally likely: a Fisher-Yates
  shuffle drawn as far as it is needed). Once the noise left cannot lift even the largest score among them ``u'``
  to the best noisy score so far (``u' + E_(j) < best``: every candidate without a noise yet gets at most
  ``E_(j)``), they cannot win and are not drawn.

The index is the one the full draw would report, with the same probability for every outcome (tested against the
exact law). On the holdout's scores (holdouts of 3 to 150 meter readings at B = 5,000, eps 0.1 to 20) it reads 4 to
11 words on average, at most 56 (the most: a few dozen candidates near the top of thousands, drawn one by one).

Random words (``operators.noise``, the threshold's domain, address 4, read in order from word 0): a uniform from a
word as everywhere here (its 53 high bits, ``(w >> 11 + 1/2) 2^-53``, never 0 or 1): the near candidates' first,
then for each order statistic ``V``, then the shuffle's position among the ``n' - j + 1`` left as the word's ``bits``
high bits (``2^bits >= n' - j + 1``, values past them rejected). ``log``, ``expm1`` and ``sqrt`` are the C
library's, as in the compiled twin (``operators._selection_kernel``), which gives the same index (tested).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

__all__ = ["WordStream", "report_noisy_max_drawn"]

_U53 = 2.0**-53
NEAR_SPAN = 2.0  # candidates within (log n + NEAR_SPAN) / eps of the top score are "near the top" ...
NEAR_MOST = 64  # ... and get a noise each when there are at most this many
_WORDS_PER_FETCH = 8  # a ChaCha20 block


class WordStream:
    """The words ``0, 1, 2, ...`` of one keystream, fetched a block at a time (``fetch(start, count)``)."""

    __slots__ = ("_at", "_buf", "_fetch", "_start")

    def __init__(self, fetch: Callable[[int, int], np.ndarray]) -> None:
        self._fetch = fetch
        self._buf: list[int] = []
        self._at = 0
        self._start = 0

    @property
    def read(self) -> int:
        """How many words were read."""
        return self._start + self._at

    def next(self) -> int:
        if self._at == len(self._buf):
            self._start += len(self._buf)
            self._buf = [int(w) for w in self._fetch(self._start, _WORDS_PER_FETCH)]
            self._at = 0
        w = self._buf[self._at]
        self._at += 1
        return w


def report_noisy_max_drawn(util: np.ndarray, epsilon: float, words: WordStream) -> int:
    """The index report-noisy-max reports for the scores ``util``: the few candidates near the top with a noise
    each, the others' noise drawn from the largest down (module docstring)."""
    n = util.size
    top = float(util.max())
    near = np.flatnonzero(util >= top - (math.log(n) + NEAR_SPAN) / epsilon)
    if near.size > NEAR_MOST:  # (read here: a test sets it to 0, every candidate then drawn from the largest down)
        near = near[:0]
    best = -math.inf
    pick = 0
    for k in near.tolist():
        noisy = float(util[k]) - math.log((float(words.next() >> 11) + 0.5) * _U53) / epsilon
        if noisy > best:
            best = noisy
            pick = k
    rest = n - near.size
    if rest == 0:
        return pick
    top_rest = top if not near.size else float(np.delete(util, near).max())
    skip = near.tolist()
    order: dict[int, int] = {}  # the shuffle of the others drawn so far: position -> candidate, where moved
    log_left = 0.0  # L_j = log(1 - U_(j))
    for j in range(rest):
        v = (float(words.next() >> 11) + 0.5) * _U53
        log_left += math.log(v) / (rest - j)
        noise = -math.log(-math.expm1(log_left)) / epsilon
        if top_rest + noise < best:  # no candidate left can reach the best
            break
        shift = 64 - max(1, (rest - j - 1).bit_length())  # a uniform position among the rest - j left
        while True:
            r = words.next() >> shift
            if r < rest - j:
                break
        q = order.get(j + r, j + r)
        order[j + r] = order.get(j, j)
        k = q  # the q-th candidate that is not near the top
        for a in skip:
            if a > k:
                break
            k += 1
        noisy = float(util[k]) + noise
        if noisy > best or (noisy == best and k < pick):
            best = noisy
            pick = k
    return pick

"""Error bars of ToPS range sums: an interval for the *true* sum, from the public parameters and the releases only.

A range of released ticks ``J`` has the released total ``R`` and the true sum ``T`` of its readings (clamped to
``[lower, B]`` as the stream takes them). What ``R`` misses of ``T`` has three parts::

    T - R = -N - P + E                                                                                       (0)

**N, the noise (Eq. 1).** A release is linear in the leaves' noisy sums ``u_k = S_k + Z_k`` (``S_k``: the true
truncated sum of leaf ``k``, ``Z_k``: its consistent noise, Appendix C): inside leaf ``k`` every tick but the last
releases the prediction ``p_k`` and the last tick releases ``u_k - (w - 1) p_k`` (Algorithm 1, Appendix D),
``w = b^s``. The recent, EMA, mean and moving-average smoothers make ``p_k`` a fixed linear combination of earlier
``u_i`` (plus the start, a public constant or the holdout's noisy mean). So ``R = sum_k c_k u_k`` + the start's
part, and

    N = sum_k c_k Z_k + c_start Z_start,   Var[N] = sum over trees sigma^2 ||M^T c_tree||^2 + c_start^2 sd_start^2   (1)

where ``M`` is the linear map from the independent node noises of one tree to its consistent leaf noises (Hay et
al.'s two passes: bottom-up ``z = a_l N + (1 - a_l) sum z(children)``, top-down ``c = z + (c(parent) - sum
z(siblings)) / b``), ``sigma^2 = 2a / (1 - a)^2`` the variance of a node's discrete Laplace noise with
``a = exp(-(eps / L) / theta)`` in quantized units (:mod:`operators.noise`), ``L = h - s``, and trees are
independent. ``M^T c`` (the weight of every node's own noise in ``N``) is computed by running the two passes
backwards (their adjoint), in O(leaves of a tree).

**P, the smoother's prediction error (Eq. 2).** A leaf the range covers only partly contributes ``j`` ticks
predicted at ``p_k`` (``j`` = the ticks of the leaf in the range, or, when the range holds the leaf's last tick, the
ticks it leaves out): ``P_k = j p_k - S_k[those ticks]`` less its noise. Writing the partial sum as its share of the
leaf sum plus a bridge (the model of ``operators.selection``, step 3)::

    E[P_k^2] = (j/w)^2 D_k + (1 - j/w) D(j) / 2,      D_k = E[(S_k - S_{k-1})^2]                           (2)

with ``D(j)`` the spread of consecutive ``j``-tick sums (for white noise ``D(j) = (j/w) D_k``; (S1) of
:mod:`operators.spread` otherwise: the holdout's per-reading variance and block spreads, since the releases carry
nothing below a leaf). ``D_k`` is measured on the releases themselves (post-processing, no budget): the releases of
a complete leaf add up to ``u_k`` exactly, so ``(u_k - u_{k-1})^2 - Var[Z_k - Z_{k-1}]`` is an unbiased estimate of
it (the noise's variance is known exactly, Eq. 1), averaged over the nearest pairs of complete leaves
(:class:`LeafSpread`): as few as give ``nu >= 30`` degrees of freedom, more when the noise hides the data's spread
(then read as the mean of ``D >= 0`` given the estimate); the parts that rest on it are widened to Student's t with
``nu`` degrees of freedom, the white part for the holdout variance's own. The first leaf is predicted by the start
(the holdout's noisy mean, or ``theta / 2``): its error is taken as ``max(D / 2, (w p_0 - u_0)^2 - Var[Z_0] - (w
sd_start)^2)``. A range that cuts a leaf before any two complete leaves were released has no model for it: those
ticks' truncated sum is taken as anywhere in ``[lower, theta]`` each (a uniform spread over that bound, never a width
of 0).

**E, what truncation at theta took (Eq. 3).** ``sum_t (v_t - theta)+`` over the range: one-sided, growing with
the range's length. The stream's truncation statistic (:mod:`operators.truncation`, a DP output of the holdout)
gives its per-tick distribution: ``E = |J| tau_hat + (E_J - |J| tau)`` with ``E_J`` the sum of ``|J|`` independent
draws of (T3) and ``tau_hat``'s own error of variance (T2). With a public theta nothing measured the readings
above it: the interval is then for the sum of the readings clamped to theta, and says so.

**The interval (Eq. 4).** ``N`` (its ``K`` largest node terms as Laplace variables, the rest normal), ``P``
(normal), ``E`` (the compound of (T3)) and ``tau_hat``'s error (its noise a Laplace term, its sampling error normal)
are independent; the 2.5 % and 97.5 % quantiles of their sum are computed from the product of their characteristic
functions by a discrete Fourier transform (:func:`quantiles`). A single Laplace term's 95 % is 2.12 standard
deviations, not 1.96; a range of a few ticks whose excess is mostly 0 and sometimes large has a skewed interval.
Since ``E >= 0``, the interval of the truncated sum (without ``E``) bounds the true sum too: each end is the larger
of the two intervals' (``tau_hat``'s noise then widens only the upper end). ``[low, high] = R + [q_2.5, q_97.5]``,
kept inside ``[|J| lower, |J| B]``.

The median smoother's prediction is not linear in the ``u_k``: no error bar for it.

>>> m = NoiseModel(epsilon=1.0, theta=10.0, fanout=4, query_range=64, smoother_layers=1)
>>> m.layers, m.leaf_ticks, m.leaves_per_tree
(2, 4, 16)
>>> one_leaf = m.variance(np.arange(4, 8))              # the 4 ticks of leaf 1: exactly its consistent noise
>>> bool(one_leaf < m.node_variance)                     # consistency lowers the variance of a leaf
True
>>> whole_tree = m.variance(np.arange(64))               # the sum of a whole tree: the sum of its top nodes
>>> bool(abs(whole_tree - m.variance(np.arange(64, 128))) < 1e-9 * whole_tree)   # every tree alike
True
>>> lo, hi = quantiles(laplace=np.array([1.0]), normal=0.0)            # one Laplace term of variance 1
>>> round(hi, 2)                                                        # log(20) / sqrt(2), not 1.96
2.12
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from operators.config import ConfigError, check_hierarchy, check_positive, check_smoother, smoother, tree_height
from operators.hierarchy import exact_range_problem, layer_weight
from operators.noise import DiscreteLaplace
from operators.spread import Spread
from operators.truncation import Truncation

__all__ = [
    "Interval",
    "LeafSpread",
    "LocalRangeError",
    "NoiseModel",
    "RangeError",
    "consistent_leaf_variance_weights",
    "node_weights",
    "prediction_coefficients",
    "quantiles",
    "student_t_quantile",
]

LAPLACE_TERMS = 24  # the node terms of N kept as Laplace variables in Eq. 4 (the rest: one normal)
TARGET_DOF = 30.0  # the nearest pairs of complete leaves estimate D_k with at least this many degrees of freedom
MIN_DOF = 8.0  # the degrees of freedom a spread the noise hides is read with
_FFT_MAX = 1 << 13
_COMPOUND_NORMAL = 64.0  # E_J is taken as normal when it expects this many ticks above theta


def _sum_groups(x: np.ndarray, b: int) -> np.ndarray:
    return x.reshape(*x.shape[:-1], -1, b).sum(axis=-1)


def node_weights(g: np.ndarray, *, fanout: int, layers: int) -> list[np.ndarray]:
    """``M^T g`` of Eq. (1), layer by layer (leaves first): the weight of every node's own noise in ``sum g_k Z_k``
    for the leaf coefficients ``g`` of one tree (length ``R b^(L-1)``; a 2-D ``g`` gives one row per sum).

    The adjoint of the two passes: top-down backwards (leaves to the top layer), then bottom-up backwards (top layer
    to the leaves).
    """
    b, L = fanout, layers
    g = np.asarray(g, dtype=np.float64)
    # top-down pass c_j = z_j + E(c_{j+1} - S z_j) / b  (E: repeat to children, S: sum of children; S = E^T)
    gz: list[np.ndarray] = [np.zeros(0)] * L
    gc = g
    for j in range(L - 1):
        up = _sum_groups(gc, b) / b  # the gradient that flows to c_{j+1}
        gz[j] = gc - np.repeat(up, b, axis=-1)
        gc = up
    gz[L - 1] = gc  # c = z on the top layer
    # bottom-up pass z_j = a_j N_j + (1 - a_j) S z_{j-1}, from the top layer down
    out: list[np.ndarray] = [np.zeros(0)] * L
    carry = None
    for j in range(L - 1, -1, -1):
        gzj = gz[j] if carry is None else gz[j] + carry
        a = layer_weight(j + 1, b)  # a_1 = 1 on the leaves
        out[j] = a * gzj
        carry = (1.0 - a) * np.repeat(gzj, b, axis=-1) if j > 0 else None
    return out


def consistent_leaf_variance_weights(g: np.ndarray, *, fanout: int, layers: int) -> float:
    """``|| M^T g ||^2`` of Eq. (1) for the leaf coefficients ``g`` of one tree (length ``R b^(L-1)``)."""
    return float(sum(float(w @ w) for w in node_weights(g, fanout=fanout, layers=layers)))


def prediction_coefficients(
    smoother_name: str, k: np.ndarray, *, alpha: float, window: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``p_k = sum_i weight * u_i / w`` (+ prior terms) as triples (row, leaf i, weight) for each ``k`` in ``k``,
    from the smoother's ``SmootherSpec.coefficients``.

    Row ``r`` refers to ``k[r]``; terms on the prior are left out (they are public constants).
    """
    coefficients = smoother(smoother_name).coefficients
    if coefficients is None:
        msg = f"no linear error model for the {smoother_name!r} smoother"
        raise ValueError(msg)
    rows, cols, ws = [], [], []
    for r, kk in enumerate(np.asarray(k, dtype=np.int64).tolist()):
        if kk <= 0:
            continue
        i, w = coefficients(kk, alpha, window)
        rows.append(np.full(i.size, r))
        cols.append(i)
        ws.append(w)
    if not rows:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
    return np.concatenate(rows), np.concatenate(cols), np.concatenate(ws)


@dataclass(frozen=True)
class NoiseModel:
    """The public parameters of a ToPS stream that fix the noise of its releases.

    ``theta`` and ``resolution`` in value units; ``smoother_layers`` is s as the stream reports it (Eq. 7 if
    ``None``, as the operator chooses it); ``start_sd``: the standard deviation of the smoother's start per tick
    (value units; 0 for the public prior ``theta / 2``). Every parameter is checked by the ranges of
    ``operators.config`` (the ones a stream's configuration is held to), and the node noise must be one the exact
    sampler draws: a model is never built from parameters no stream could have released with (they may come from a
    status message).
    """

    epsilon: float
    theta: float
    fanout: int = 16
    query_range: int = 1 << 20
    smoother_layers: int | None = None
    smoother: str = "recent"
    alpha: float = 0.6
    window: int = 8
    resolution: float = 1.0
    start_sd: float = 0.0

    def __post_init__(self) -> None:
        check_positive("epsilon", self.epsilon)
        check_positive("theta", self.theta)
        check_positive("resolution", self.resolution)
        if not (isinstance(self.start_sd, int | float) and math.isfinite(self.start_sd) and self.start_sd >= 0):
            msg = f"start_sd must be a finite number >= 0 (got {self.start_sd!r:.40})"
            raise ConfigError(msg)
        h = check_hierarchy(self.query_range, self.fanout, self.smoother_layers)
        check_smoother(self.smoother, self.alpha, self.window)
        problem = exact_range_problem(self.theta / self.resolution, self.epsilon, self.fanout, h)
        if problem:
            raise ConfigError(problem)

    @property
    def height(self) -> int:
        return tree_height(self.query_range, self.fanout)

    @property
    def s(self) -> int:
        if self.smoother_layers is not None:
            return int(self.smoother_layers)
        from operators.threshold import smoother_layers

        return min(smoother_layers(self.epsilon, self.query_range, self.fanout), self.height - 1)

    @property
    def layers(self) -> int:
        return self.height - self.s

    @property
    def leaf_ticks(self) -> int:
        return self.fanout**self.s

    @property
    def leaves_per_tree(self) -> int:
        return self.query_range // self.leaf_ticks

    @property
    def theta_units(self) -> int:
        return max(1, round(self.theta / self.resolution))

    @property
    def node_variance(self) -> float:
        """``sigma^2 = 2a / (1 - a)^2``, ``a = exp(-(eps / L) / theta)``, in quantized units squared."""
        return DiscreteLaplace(self.epsilon / self.layers, self.theta_units).variance

    @property
    def linear(self) -> bool:
        """The smoother's prediction is linear in earlier leaf sums (``SmootherSpec.linear``): Eq. 1 holds."""
        return smoother(self.smoother).linear

    # -- the leaf coefficients c_k of Eq. (1) ---------------------------------------------------------------------
    def leaf_coefficients(self, released: np.ndarray) -> dict[int, float]:
        """``c_k`` of Eq. (1) for the sum of the releases at ``released`` (indices counted from the first released
        tick, each at most once)."""
        leaves, coef, _ = self._coefficients(*self._leaf_counts(released))
        return dict(zip(leaves.tolist(), coef.tolist(), strict=True))

    def _leaf_counts(self, released: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The leaves ``released`` touches, how many of their ticks it holds, and whether it holds their last."""
        j = np.unique(np.asarray(released, dtype=np.int64))
        if j.size and j[0] < 0:
            msg = "a released index is negative (a holdout tick has no release)"
            raise ValueError(msg)
        w = self.leaf_ticks
        leaf = j // w
        keys, counts = np.unique(leaf, return_counts=True)
        last = np.zeros(keys.size, dtype=bool)
        last[np.searchsorted(keys, leaf[(j % w) == w - 1])] = True
        return keys, counts, last

    def range_counts(self, first: int, last: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`_leaf_counts` of the contiguous range ``first..last`` (inclusive), in O(leaves)."""
        w = self.leaf_ticks
        k0, k1 = first // w, last // w
        keys = np.arange(k0, k1 + 1, dtype=np.int64)
        counts = np.full(keys.size, w, dtype=np.int64)
        counts[0] -= first - k0 * w
        counts[-1] -= (k1 + 1) * w - 1 - last
        if k0 == k1:
            counts[0] = last - first + 1
        held_last = np.ones(keys.size, dtype=bool)
        held_last[-1] = last % w == w - 1
        return keys, counts, held_last

    def _coefficients(self, keys: np.ndarray, counts: np.ndarray, held_last: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray, float]:
        """``(leaves, c_k, c_start)`` of Eq. (1) from the leaves a set of releases touches (their ticks held and
        whether the last is): ``e_k = 1`` for a held last tick, the prediction ``p_k`` weighted ``n_k - (w - 1) e_k``
        and spread over earlier leaves by the smoother; ``c_start`` weights the start (leaf 0's prediction)."""
        if not self.linear:
            msg = f"no linear error model for the {self.smoother!r} smoother"
            raise ValueError(msg)
        w = self.leaf_ticks
        e = held_last.astype(np.float64)
        pw = (counts - e) - (w - 1) * e  # the weight of p_k: the non-last ticks held, less w - 1 with the last
        c_start = float(pw[0]) if keys.size and keys[0] == 0 else 0.0
        partial = np.flatnonzero(pw)
        rows, cols, ws = prediction_coefficients(self.smoother, keys[partial], alpha=self.alpha, window=self.window)
        all_keys = np.concatenate([keys[held_last], cols])
        all_coef = np.concatenate([np.ones(int(held_last.sum())), pw[partial][rows] * ws / w])
        leaves, inv = np.unique(all_keys, return_inverse=True)
        coef = np.zeros(leaves.size)
        np.add.at(coef, inv, all_coef)
        return leaves, coef, c_start

    # -- Eq. (1) ---------------------------------------------------------------------------------------------------
    def node_terms(self, leaves: np.ndarray, coef: np.ndarray) -> np.ndarray:
        """The weights (quantized units) of the independent node noises in ``sum c_k Z_k``: Eq. (1)'s ``M^T c`` of
        every tree the leaves are in, the non-zero ones."""
        lpt = self.leaves_per_tree
        out = []
        trees = leaves // lpt
        for t in np.unique(trees).tolist():
            at = trees == t
            g = np.zeros(lpt)
            g[leaves[at] % lpt] = coef[at]
            for layer in node_weights(g, fanout=self.fanout, layers=self.layers):
                out.append(layer[layer != 0.0])
        return np.concatenate(out) if out else np.zeros(0)

    def variance(self, released: np.ndarray) -> float | None:
        """Eq. (1): the noise variance (value units squared) of the sum of the releases at ``released``, the start's
        noise included; ``None`` for the median smoother."""
        if not self.linear:
            return None
        leaves, coef, c_start = self._coefficients(*self._leaf_counts(released))
        nodes = self.node_terms(leaves, coef)
        return (float(nodes @ nodes) * self.node_variance * self.resolution**2
                + (c_start * self.start_sd) ** 2)

    def stderr(self, released: np.ndarray) -> float | None:
        v = self.variance(released)
        return None if v is None else math.sqrt(v)

    @cached_property
    def leaf_variance(self) -> float:
        """``Var[Z_k]`` (value units squared): the same for every leaf."""
        g = np.zeros(self.leaves_per_tree)
        g[0] = 1.0
        return consistent_leaf_variance_weights(g, fanout=self.fanout, layers=self.layers) * self._unit

    @property
    def _unit(self) -> float:
        return self.node_variance * self.resolution**2

    @cached_property
    def _pair_variances(self) -> np.ndarray:
        """``Var[Z_{k+1} - Z_k]`` by the layer of the two leaves' lowest common ancestor (index ``l - 1`` for an
        ancestor ``l`` layers up; the last entry: no common ancestor, different top nodes or trees)."""
        b, lpt = self.fanout, self.leaves_per_tree
        out = []
        for level in range(1, self.layers):
            k = b ** (level - 1) - 1  # the pair (b^(l-1) - 1, b^(l-1)) meets l layers up
            g = np.zeros(lpt)
            g[k], g[k + 1] = -1.0, 1.0
            out.append(consistent_leaf_variance_weights(g, fanout=b, layers=self.layers) * self._unit)
        out.append(2.0 * self.leaf_variance)
        return np.asarray(out)

    def pair_variance(self, k: np.ndarray) -> np.ndarray:
        """``Var[Z_{k+1} - Z_k]`` for each leaf ``k`` (value units squared), from the layer where ``k`` and ``k + 1``
        meet (exact: every node of a layer is alike)."""
        k = np.asarray(k, dtype=np.int64)
        b, lpt = self.fanout, self.leaves_per_tree
        pos = k % lpt
        level = np.full(k.shape, self.layers - 1, dtype=np.int64)  # no common ancestor
        for lv in range(self.layers - 1, 0, -1):
            same = (pos // b**lv == (pos + 1) // b**lv) & (pos + 1 < lpt)
            level = np.where(same, lv - 1, level)
        return self._pair_variances[level]


# -- P: the smoother's prediction error (Eq. 2) --------------------------------------------------------------------
class LeafSpread:
    """``D_k = E[(S_k - S_{k-1})^2]`` near every leaf, measured on a stream's releases (Eq. 2).

    ``released``: the releases by released index (index 0 = the first tick after the holdout), NaN where none was
    received. A leaf whose releases all arrived has the noisy sum ``u_k``; each pair of consecutive complete leaves
    gives ``(u_{k+1} - u_k)^2 - Var[Z_{k+1} - Z_k]``. ``D_k`` averages the nearest pairs, as many as give
    ``TARGET_DOF`` degrees of freedom (``nu = n D^2 / (D + V)^2``, ``V`` the pairs' mean noise variance; the
    estimate's variance is ``2 (D + V)^2 / n``), all of them if fewer do.
    """

    def __init__(self, model: NoiseModel, released: np.ndarray) -> None:
        self.model = model
        w = model.leaf_ticks
        x = np.asarray(released, dtype=np.float64)
        n_leaves = x.size // w
        sums = x[: n_leaves * w].reshape(n_leaves, w).sum(axis=1) if n_leaves else np.zeros(0)
        self.u = sums  # NaN for a leaf with a release missing
        self.first_prediction = float(x[0]) if w > 1 and x.size and math.isfinite(x[0]) else None
        ok = np.isfinite(sums[1:]) & np.isfinite(sums[:-1])
        self.pair_at = np.flatnonzero(ok)  # pair k: leaves k and k + 1
        d = sums[1:][ok] - sums[:-1][ok]
        v = model.pair_variance(self.pair_at)
        self._c_excess = np.concatenate([[0.0], np.cumsum(d * d - v)])
        self._c_var = np.concatenate([[0.0], np.cumsum(v)])

    def at(self, k: int) -> tuple[float, float] | None:
        """``(D_k, nu)`` near leaf ``k``; None when no pair of complete leaves was released.

        The estimate ``D^ ~ N(D, s^2)``, ``s^2 = 2 (D^+ + V)^2 / n``, is read as the mean of ``D >= 0`` given it
        (a flat prior: ``D^ + s phi(D^/s) / Phi(D^/s)``), so that a spread the noise hides is neither 0 nor
        negative; ``nu = 2 D^2 / s^2``, at least ``MIN_DOF``."""
        n_pairs = self.pair_at.size
        if not n_pairs:
            return None
        centre = int(np.searchsorted(self.pair_at, k))
        n = min(n_pairs, 16)
        while True:
            lo = max(0, min(centre - n // 2, n_pairs - n))
            hi = lo + n
            d = (self._c_excess[hi] - self._c_excess[lo]) / n
            v = (self._c_var[hi] - self._c_var[lo]) / n
            nu = n * d * d / (d + v) ** 2 if d > 0 else 0.0
            if nu >= TARGET_DOF or n == n_pairs:
                break
            n = min(n_pairs, 2 * n)
        s = math.sqrt(2.0 / n) * (max(d, 0.0) + v)
        if s <= 0:
            return max(d, 0.0), TARGET_DOF
        r = d / s
        mean = d + s * math.exp(-0.5 * r * r) / math.sqrt(2.0 * math.pi) / max(0.5 * math.erfc(-r / math.sqrt(2.0)),
                                                                             1e-300)
        return mean, max(2.0 * mean * mean / (s * s), MIN_DOF)


def student_t_quantile(p: float, nu: float) -> float:
    """Student's t quantile (Cornish-Fisher in ``1 / nu``; within 0.3 % for ``nu >= 2``; ``nu < 2``: the quantile
    of ``nu = 1``, wider)."""
    z = _normal_quantile(p)
    if nu < 2:
        return math.tan(math.pi * (p - 0.5))
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / nu + g2 / nu**2 + g3 / nu**3 + g4 / nu**4


def _normal_quantile(p: float) -> float:
    """The standard normal quantile (Acklam's rational approximation refined by one Newton step)."""
    if not 0.0 < p < 1.0:
        raise ValueError("p must be in (0, 1)")
    a = (-3.969683028665376e01, 2.209460984245205e02, -2.759285104469687e02, 1.383577518672690e02,
         -3.066479806614716e01, 2.506628277459239e00)
    b = (-5.447609879822406e01, 1.615858368580409e02, -1.556989798598866e02, 6.680131188771972e01,
         -1.328068155288572e01)
    c = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e00, -2.549732539343734e00,
         4.374664141464968e00, 2.938163982698783e00)
    d = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00, 3.754408661907416e00)
    q = min(p, 1.0 - p)
    if q < 0.02425:
        r = math.sqrt(-2.0 * math.log(q))
        x = (((((c[0] * r + c[1]) * r + c[2]) * r + c[3]) * r + c[4]) * r + c[5]) / \
            ((((d[0] * r + d[1]) * r + d[2]) * r + d[3]) * r + 1.0)
    else:
        r = (q - 0.5) ** 2
        x = (q - 0.5) * (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) / \
            (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1.0)
    if p > 0.5:
        x = -x
    e = 0.5 * math.erfc(-x / math.sqrt(2.0)) - p  # one Newton step
    return x - e * math.sqrt(2.0 * math.pi) * math.exp(x * x / 2.0)


# -- Eq. (4): the quantiles of independent parts -------------------------------------------------------------------
def quantiles(*, laplace: np.ndarray, normal: float, uniform: np.ndarray | None = None,
              compound: tuple[int, np.ndarray, np.ndarray] | None = None, level: float = 0.95
              ) -> tuple[float, float]:
    """The ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of the sum of independent parts with mean 0:
    Laplace variables of variances ``laplace``, a normal of variance ``normal``, uniforms of half-widths
    ``uniform``, and ``compound = (n, x, p)``: the sum of ``n`` independent draws taking ``x_j`` with probability
    ``p_j`` (and 0 with the rest), less its mean.

    From the product of the characteristic functions (Laplace ``1 / (1 + b^2 t^2)``, normal ``exp(-v t^2 / 2)``,
    uniform ``sin(a t) / (a t)``, compound ``(1 - sum p + sum p e^(i t x))^n``), inverted by a discrete Fourier
    transform on a grid fine enough for the smooth parts and wide enough for the compound's reach. Parts that are
    nearly normal (a compound expecting many non-zero draws; Laplace terms each a small share of the variance) are
    taken as normal, and with nothing else the quantiles are ``+- z sd``.
    """
    lo_p, hi_p = (1.0 - level) / 2.0, (1.0 + level) / 2.0
    lap = np.asarray(laplace, dtype=np.float64)
    lap = lap[lap > 0]
    uni = np.zeros(0) if uniform is None else np.asarray(uniform, dtype=np.float64)
    uni = uni[uni > 0]
    normal = float(max(normal, 0.0))
    comp = None
    if compound is not None:
        n, x, p = compound
        keep = p > 0
        x, p = np.asarray(x, dtype=np.float64)[keep], np.asarray(p, dtype=np.float64)[keep]
        mean = n * float(p @ x)
        var = n * (float(p @ (x * x)) - float(p @ x) ** 2)
        if n > 0 and p.size:
            if n * p.sum() >= _COMPOUND_NORMAL:
                normal += max(var, 0.0)
            else:
                comp = (n, x, p, mean, var)
    total = normal + float(lap.sum()) + float((uni * uni).sum()) / 3.0 + (comp[4] if comp else 0.0)
    if total <= 0.0:
        return 0.0, 0.0
    if lap.size and lap.max() < 0.05 * total:
        normal += float(lap.sum())
        lap = np.zeros(0)
    if not lap.size and not uni.size and comp is None:
        z = _normal_quantile(hi_p)
        return -z * math.sqrt(normal), z * math.sqrt(normal)
    sd = math.sqrt(total)
    smooth = math.sqrt(normal + float(lap.sum()) + float((uni * uni).sum()) / 3.0)
    reach = 8.0 * sd + float(uni.sum())
    if comp is not None:
        n, x, p, mean, _ = comp
        draws = min(n, math.ceil(n * p.sum() + 6.0 * math.sqrt(n * p.sum()) + 6.0))
        reach = max(reach, draws * float(x.max()) + 8.0 * smooth + mean)
    step = max(smooth / 8.0, 2.0 * reach / _FFT_MAX) if smooth > 0 else 2.0 * reach / 4096
    size = 1 << max(9, math.ceil(math.log2(2.0 * reach / step)))
    size = min(size, _FFT_MAX)
    step = 2.0 * reach / size
    t = 2.0 * math.pi * np.fft.fftfreq(size, d=step)
    cf = np.exp(-0.5 * normal * t * t).astype(np.complex128)
    for v in lap:
        b2 = v / 2.0
        cf /= 1.0 + b2 * t * t
    for a in uni:
        cf *= np.sinc(a * t / math.pi)
    if comp is not None:
        n, x, p, mean, _ = comp
        one = (1.0 - p.sum()) + np.exp(1j * np.outer(t, x)) @ p
        cf *= one**n * np.exp(-1j * t * mean)
    # density on the grid y_i = -reach + i step: f(y) = (1/2pi) int cf(t) e^(-ity) dt
    # f(y_i) = (1 / (size step)) sum_k cf(t_k) e^(-i t_k y_i), y_i = y_0 + i step: numpy's forward transform
    y = -reach + step * np.arange(size)
    dens = np.maximum(np.real(np.fft.fft(cf * np.exp(-1j * t * y[0]))), 0.0)
    cdf = np.cumsum(dens)
    if cdf[-1] <= 0:
        z = _normal_quantile(hi_p)
        return -z * sd, z * sd
    cdf /= cdf[-1]
    mid = y + step / 2.0
    return float(np.interp(lo_p, cdf, mid)), float(np.interp(hi_p, cdf, mid))


def _within(low: float, high: float, floor: float, top: float) -> tuple[float, float]:
    """``[low, high]`` intersected with the sums the readings can have, ``[floor, top]``; an interval outside them
    (a release's noise far in its tail) is moved inside, its width kept as far as they allow (never a point)."""
    width = high - low
    if high < floor:
        low, high = floor, floor + width
    elif low > top:
        low, high = top - width, top
    low, high = max(low, floor), min(high, top)
    return low, max(high, low + min(width, top - low)) if top > low else high


# -- the whole interval (Eq. 0-4) ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Interval:
    """A range sum and its interval for the true sum. ``low``/``high`` are None when there is no interval
    (``note`` says why); ``noise_sd``, ``smoother_sd`` and ``truncation_mean``/``truncation_sd`` are the parts of
    Eq. (0). ``clamped_to_theta``: the interval is for the sum of the readings clamped to theta (nothing measured
    the readings above it)."""

    total: float
    low: float | None
    high: float | None
    noise_sd: float | None = None
    smoother_sd: float | None = None
    truncation_mean: float | None = None
    truncation_sd: float | None = None
    clamped_to_theta: bool = False
    note: str = ""


class RangeError:
    """Intervals for the true range sums of one stream (Eq. 0-4): its noise model, its releases (by released index,
    NaN where none arrived), its truncation statistic (None: not measured) and its value range."""

    def __init__(self, model: NoiseModel, released: np.ndarray, truncation: Truncation | None, *,
                 lower: float = 0.0, bound: float | None = None, level: float = 0.95,
                 spread: Spread | None = None, nothing_truncated: bool = False) -> None:
        self.model = model
        self.nothing_truncated = nothing_truncated  # theta = B: the truncated sum is the sum
        self.x = np.asarray(released, dtype=np.float64)
        self.truncation = truncation
        self.lower = lower
        self.bound = bound
        self.level = level
        self._z = _normal_quantile((1.0 + level) / 2.0)
        self.spread = LeafSpread(model, self.x) if model.linear else None
        self.spread_stat = spread
        self._white_infl = 1.0
        if spread is not None and spread.variance > 0:  # sigma^2's own noise: its degrees of freedom
            noise = spread.variance_noise
            self._white_infl = self._inflation(2.0 * spread.variance**2 / noise) if noise > 0 else 1.0
        self._c = np.concatenate([[0.0], np.cumsum(np.nan_to_num(self.x))])
        self._n = np.concatenate([[0], np.cumsum(np.isfinite(self.x))])

    def interval(self, first: int, last: int) -> Interval:
        """The interval for the true sum of the readings at released indexes ``first..last`` that have a release
        (inclusive; a range past the releases counts only those): Eq. (4) of Eq. (1)-(3)'s parts."""
        m = self.model
        first, last = max(0, first), min(last, self.x.size - 1)
        if last < first:
            return Interval(0.0, 0.0, 0.0, note="no release in the range")
        total = float(self._c[last + 1] - self._c[first])
        count = int(self._n[last + 1] - self._n[first])
        if count == 0:
            return Interval(0.0, 0.0, 0.0, note="no release in the range")
        if not m.linear:
            return Interval(total, None, None, note=f"no error model for the {m.smoother} smoother")
        if count == last - first + 1:
            leaves = m.range_counts(first, last)
        else:
            leaves = m._leaf_counts(first + np.flatnonzero(np.isfinite(self.x[first:last + 1])))
        node_vars, start_var = self.noise_part(*leaves)
        p_var, uniform, shift = self.smoother_part(*leaves)
        # Eq. (4) without E: the interval for the sum of the readings truncated at theta
        lap = np.sort(node_vars)[::-1]
        laplace_terms = np.append(lap[:LAPLACE_TERMS], start_var)
        normal = float(lap[LAPLACE_TERMS:].sum()) + p_var
        spread = np.asarray(uniform)
        lo, hi = quantiles(laplace=laplace_terms, normal=normal, uniform=spread, level=self.level)
        centre = total + shift
        low, high = centre + lo, centre + hi
        # Eq. (3): T = T_theta + E with E >= 0, so either interval's ends bound T's (the larger of each)
        t_mean = t_sd = None
        part = self.truncation_part(count)
        if part is not None:
            t_mean, t_sd, tau_noise, sample, compound = part
            lo, hi = quantiles(laplace=np.append(laplace_terms, tau_noise), normal=normal + sample, uniform=spread,
                               compound=compound, level=self.level)
            low, high = max(low, centre + t_mean + lo), max(high, centre + t_mean + hi)
        clamped = part is None and not self.nothing_truncated
        top = count * m.theta if clamped else (count * self.bound if self.bound is not None else math.inf)
        low, high = _within(low, high, count * self.lower, top)
        note = "" if not uniform else "a leaf cut before two complete leaves were released: bounded by theta"
        return Interval(total, low, high, math.sqrt(float(node_vars.sum()) + start_var), math.sqrt(p_var), t_mean,
                        t_sd, clamped_to_theta=clamped, note=note)

    def noise_part(self, keys: np.ndarray, counts: np.ndarray, held_last: np.ndarray) -> tuple[np.ndarray, float]:
        """Eq. (1): the variances (value units) of the node terms of ``N``, and the start's, for a range touching
        ``keys`` leaves (``counts`` of their ticks, whether it holds their last)."""
        m = self.model
        leaves, coef, c_start = m._coefficients(keys, counts, held_last)
        nodes = m.node_terms(leaves, coef)
        return nodes * nodes * m._unit, (c_start * m.start_sd) ** 2

    def smoother_part(self, keys: np.ndarray, counts: np.ndarray, held_last: np.ndarray
                      ) -> tuple[float, list[float], float]:
        """Eq. (2): the variance of ``P`` over the leaves the range covers only partly (each widened for its
        estimate's degrees of freedom), and, for a leaf with no model yet, the half-width of its ticks' bound and the
        shift to the bound's middle."""
        m = self.model
        w = m.leaf_ticks
        p_var, uniform, shift = 0.0, [], 0.0
        predicted = np.where(held_last, w - counts, counts)
        for k, j, last in zip(keys[counts < w].tolist(), predicted[counts < w].tolist(),
                              held_last[counts < w].tolist(), strict=True):
            got = self._spread_at(k)
            if got is None:  # no model: the truncated sum of these j ticks is anywhere in [lower, theta] each
                pred = self._prediction(k)
                uniform.append(j * (m.theta - self.lower) / 2.0)
                # R holds j * p_k for them (or removes it, with the leaf's last tick): centre on the bound's middle
                shift += (-1.0 if last else 1.0) * j * ((m.theta + self.lower) / 2.0 - (pred or 0.0))
                continue
            d, nu = got
            f = j / w
            infl = self._inflation(nu)
            sp = self.spread_stat
            if sp is None:  # (S1) without the holdout's spread: white noise at the leaves' D(w)
                p_var += (f * f * d + (1.0 - f) * f * d / 2.0) * infl
            else:  # (S1): the white part and the blocks from the holdout, the leaves' D(w) from the releases
                white = 2.0 * sp.variance * j
                rest = max(0.0, sp.structure(j, leaf_ticks=w, leaf_d=d) - white)
                p_var += (f * f * d + (1.0 - f) * rest / 2.0) * infl + (1.0 - f) * white / 2.0 * self._white_infl
        return p_var, uniform, shift

    def truncation_part(self, count: int) -> tuple[float, float, float, float, tuple] | None:
        """Eq. (3) for ``count`` ticks: the mean and standard deviation of ``E``, the variance of ``tau_hat``'s noise
        (a Laplace term) and of its sampling error (normal), and the compound of (T3); None without a statistic."""
        trunc = self.truncation
        if trunc is None:
            return None
        x, p = trunc.shape()
        tau_noise = count * count * trunc.tau_noise_variance
        sample = count * count * trunc.per_tick_variance / trunc.holdout
        sd = math.sqrt(count * trunc.per_tick_variance + tau_noise + sample)
        return count * trunc.tau, sd, tau_noise, sample, (count, x, p)

    def _inflation(self, nu: float) -> float:
        """How much a variance estimated with ``nu`` degrees of freedom widens its part (Student's t over normal,
        squared)."""
        return (student_t_quantile((1.0 + self.level) / 2.0, max(nu, MIN_DOF)) / self._z) ** 2

    def _spread_at(self, k: int) -> tuple[float, float] | None:
        """``(D, nu)`` for the prediction of leaf ``k`` (Eq. 2; the first leaf: the start's, see the module)."""
        got = self.spread.at(k) if self.spread is not None else None
        if got is None or k != 0:
            return got
        d, nu = got
        m, sp = self.model, self.spread
        w = m.leaf_ticks
        first = d / 2.0
        if sp is not None and sp.u.size and math.isfinite(sp.u[0]) and sp.first_prediction is not None:
            seen = (w * sp.first_prediction - sp.u[0]) ** 2 - m.leaf_variance - (w * m.start_sd) ** 2
            first = max(first, seen)
        return first, nu

    def _prediction(self, k: int) -> float | None:
        """The prediction ``p_k`` as released (a tick of leaf ``k`` other than its last), if received."""
        w = self.model.leaf_ticks
        if w == 1:
            return None
        seg = self.x[k * w: k * w + w - 1]
        seg = seg[np.isfinite(seg)]
        return float(seg[0]) if seg.size else None


class LocalRangeError:
    """Intervals for the range sums of a local-mode (ToPL) stream: each release is the unbiased Hybrid report of its
    tick's reading truncated at theta (Wang et al., Continuous Release of Data Streams under both Centralized and
    Local Differential Privacy, CCS 2021, Section 4.2; one report a tick), so a range sum is the truncated sum plus
    independent noise of variance ``theta^2 / 4 Var_HM(x, eps)`` per tick (:mod:`operators.local.hybrid`):
    Eq. 22's for ``eps > 0.61`` (the same for every reading), and Stochastic Rounding's ``s^2 - x^2`` below, taken
    at ``x`` = the readings' mean on the unit scale, estimated from all releases (an upper bound: ``E[x^2] >=
    E[x]^2``). The sum of many bounded reports is normal; the interval is clipped to ``[0, |J| B]``. Truncation:
    :class:`operators.truncation.Truncation` when the stream states one, else the interval is for the readings
    clamped to theta."""

    def __init__(self, epsilon: float, theta: float, released: np.ndarray, truncation: Truncation | None, *,
                 bound: float | None = None, level: float = 0.95) -> None:
        from operators.local.hybrid import HYBRID_PM_THRESHOLD, hybrid_worst_case_variance
        from operators.local.stochastic_rounding import stochastic_rounding_scale

        self.theta = theta
        self.x = np.asarray(released, dtype=np.float64)
        self.truncation = truncation
        self.bound = bound
        self.level = level
        if epsilon > HYBRID_PM_THRESHOLD:
            unit = hybrid_worst_case_variance(epsilon)
        else:
            finite = self.x[np.isfinite(self.x)]
            mean = float(np.clip(2.0 * finite.mean() / theta - 1.0, -1.0, 1.0)) if finite.size else 0.0
            unit = stochastic_rounding_scale(epsilon) ** 2 - mean * mean
        self.per_tick_variance = theta * theta / 4.0 * unit
        self._c = np.concatenate([[0.0], np.cumsum(np.nan_to_num(self.x))])
        self._n = np.concatenate([[0], np.cumsum(np.isfinite(self.x))])

    def interval(self, first: int, last: int) -> Interval:
        """The interval for the true sum of the readings at released indexes ``first..last`` that have a release."""
        first, last = max(0, first), min(last, self.x.size - 1)
        if last < first:
            return Interval(0.0, 0.0, 0.0, note="no release in the range")
        total = float(self._c[last + 1] - self._c[first])
        count = int(self._n[last + 1] - self._n[first])
        noise = count * self.per_tick_variance
        lo, hi = quantiles(laplace=np.zeros(0), normal=noise, level=self.level)
        low, high = total + lo, total + hi
        trunc = self.truncation
        t_mean = t_sd = None
        if trunc is not None:
            x, p = trunc.shape()
            t_mean = count * trunc.tau
            tau_noise = count * count * trunc.tau_noise_variance
            sample = count * count * trunc.per_tick_variance / trunc.holdout
            t_sd = math.sqrt(count * trunc.per_tick_variance + tau_noise + sample)
            lo, hi = quantiles(laplace=np.array([tau_noise]), normal=noise + sample, compound=(count, x, p),
                               level=self.level)
            low, high = max(low, total + t_mean + lo), max(high, total + t_mean + hi)
        top = count * (self.bound if trunc is not None and self.bound is not None else self.theta)
        low, high = _within(low, high, 0.0, top)
        return Interval(total, low, high, math.sqrt(noise), 0.0, t_mean, t_sd, clamped_to_theta=trunc is None,
                        note="" if trunc is not None else "local mode: nothing measured the readings above theta")

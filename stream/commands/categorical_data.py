"""A synthetic stand-in for the commuting data of Finnegan's thesis (2024, section 5), reproducible from a seed.

Same shape as POWSCAR 2016 as the thesis uses it: n = 2,750,238 users, one commute each; 3,130 electoral divisions
(3,126 places of residence plus 4 destination-only places: Northern Ireland, overseas, no fixed place, from home) in
31 counties, so 9,796,900 = 3130^2 origin-destination (OD) cells of which 287,116 are non-empty (135,771 of them
holding one user in the data, 139,515 in the stand-in; the largest 5,871), and 1,085 = 31 x 35 county cells of
which 6 are empty. Commutes stay in their county about 60% of the time; the non-empty cells' counts are Zipf-like
(exponent 1.7, truncated at 5,871, the non-single counts scaled so that they sum to n). Nothing here is real data.

>>> data = synthetic_dataset(seed=0)
>>> data.n, data.d_county, data.d_od, data.od_cells.size, int(data.od_counts.max())
(2750238, 1085, 9796900, 287116, 5871)
>>> int((data.county_counts() == 0).sum())
6
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["CategoricalData", "synthetic_dataset"]

N_USERS = 2_750_238
N_COUNTIES = 31
N_PLACES = 3126
N_SPECIAL = 4
N_NONEMPTY = 287_116
N_SINGLE = 135_771
MAX_CELL = 5871
EMPTY_COUNTY_CELLS = 6


@dataclass(frozen=True)
class CategoricalData:
    """One category per user at two levels: ``od`` in ``[0, 3130^2)`` and ``county`` in ``[0, 31 * 35)``."""

    od_cells: np.ndarray  # non-empty OD cells (sorted)
    od_counts: np.ndarray  # their counts
    county_of_cell: np.ndarray  # the county cell of each non-empty OD cell
    d_od: int = (N_PLACES + N_SPECIAL) ** 2
    d_county: int = N_COUNTIES * (N_COUNTIES + N_SPECIAL)

    @property
    def n(self) -> int:
        return int(self.od_counts.sum())

    def county_counts(self) -> np.ndarray:
        return np.bincount(self.county_of_cell, weights=self.od_counts, minlength=self.d_county).astype(np.int64)

    def users(self, level: str) -> np.ndarray:
        """Each user's category (int64, grouped by category)."""
        cells = self.od_cells if level == "od" else self.county_of_cell
        return np.repeat(cells, self.od_counts)

    def counts(self, level: str) -> np.ndarray:
        """The dense true histogram at ``level`` ("county" or "od")."""
        if level == "county":
            return self.county_counts()
        out = np.zeros(self.d_od, dtype=np.int64)
        out[self.od_cells] = self.od_counts
        return out


def synthetic_dataset(seed: int = 0, scale: float = 1.0) -> CategoricalData:
    """The stand-in (``scale`` < 1 shrinks the number of non-empty cells and users, for tests)."""
    rng = np.random.default_rng(seed)
    places = N_PLACES + N_SPECIAL
    county = np.sort(rng.integers(0, N_COUNTIES, N_PLACES))
    county_dest = np.concatenate([county, N_COUNTIES + np.arange(N_SPECIAL)])
    by_county = [np.flatnonzero(county == c) for c in range(N_COUNTIES)]
    empty = rng.choice(N_COUNTIES * (N_COUNTIES + N_SPECIAL), EMPTY_COUNTY_CELLS, replace=False)
    target = max(10, round(N_NONEMPTY * scale))
    cells = np.empty(0, dtype=np.int64)
    while cells.size < target:
        m = 2 * (target - cells.size) + 1000
        o = rng.integers(0, N_PLACES, m)
        u = rng.random(m)
        same = np.array([by_county[c][rng.integers(0, by_county[c].size)] for c in county[o]]) if m else o
        dest = np.where(u < 0.6, same, np.where(u < 0.95, rng.integers(0, N_PLACES, m),
                                                  N_PLACES + rng.integers(0, N_SPECIAL, m)))
        cc = county[o] * (N_COUNTIES + N_SPECIAL) + county_dest[dest]
        new = (o * places + dest)[~np.isin(cc, empty)]
        cells = np.unique(np.concatenate([cells, new]))
        if cells.size > target:
            cells = np.sort(rng.choice(cells, target, replace=False))
    n = max(target, round(N_USERS * scale))
    counts = np.minimum(rng.zipf(1.7, target), MAX_CELL).astype(np.int64)
    counts[rng.choice(target, 1)] = MAX_CELL
    big = counts > 1
    spare = n - int((~big).sum())
    scaled = np.maximum(2, np.floor(counts[big] * spare / counts[big].sum())).astype(np.int64)
    scaled = np.minimum(scaled, MAX_CELL)
    order = np.argsort(-scaled, kind="stable")
    scaled[order[0]] = min(MAX_CELL, spare - 2 * (scaled.size - 1))  # the largest cell, as in the data
    order = order[1:]
    rest = spare - int(scaled.sum())
    i = 0
    while rest != 0:  # put the rounding remainder on the largest cells (within [2, MAX_CELL])
        j = order[i % order.size]
        step = 1 if rest > 0 else -1
        if 2 <= scaled[j] + step <= MAX_CELL:
            scaled[j] += step
            rest -= step
        i += 1
    counts[big] = scaled
    o, dst = np.divmod(cells, places)
    county_cell = county[o] * (N_COUNTIES + N_SPECIAL) + county_dest[dst]
    return CategoricalData(cells, counts, county_cell.astype(np.int64))

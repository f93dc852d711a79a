"""The real streams shipped with tops, by name: ``dns``, ``retail``, ``star``.

They come from the data folder of the public ToPS reference repository dp-cont/dp-cont (MIT license, notice in
``stream/data/LICENSE.dp-cont``) and are stored as compressed ``uint8`` arrays (``stream/data/NAME.npz``, about
190 kB together). Every command that reads a stream file also takes one of these names in its place
(``tops replay dns ...``, ``tops compare dns ...``, ``tops evaluate dns releases.jsonl``).

========  ============================================================================  =========  ==========  ======
name      what                                                                          ticks      min / max   B
========  ============================================================================  =========  ==========  ======
dns       DNS queries per second for one second-level domain at a campus resolver      355,872    1 / 28      500
retail    sizes of retail basket transactions (the FIMI "retail" set)                   88,162     1 / 76      16,470
star      sizes of the transactions of another FIMI set                                 49,046     49 / 63     2,088
========  ============================================================================  =========  ==========  ======

B is the public bound the reference code uses for the stream.

>>> x = load("dns")
>>> x.dtype, x.shape, int(x.min()), int(x.max())
(dtype('int64'), (355872,), 1, 28)
>>> extended("retail", 200_000).shape
(200000,)
>>> load("taxi")
Traceback (most recent call last):
...
KeyError: "no shipped data set 'taxi' (there are: dns, retail, star)"
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

import numpy as np

__all__ = ["DATASETS", "Dataset", "extended", "load"]


@dataclass(frozen=True)
class Dataset:
    name: str
    what: str
    bound: float  # the reference code's public bound B
    file: str


DATASETS: dict[str, Dataset] = {
    d.name: d
    for d in (
        Dataset("dns", "DNS queries per second for one domain at a campus resolver", 500.0, "dns.npz"),
        Dataset("retail", "sizes of retail basket transactions (FIMI retail)", 16470.0, "retail.npz"),
        Dataset("star", "sizes of transactions of another FIMI set", 2088.0, "star.npz"),
    )
}


def load(name: str) -> np.ndarray:
    """The stream ``name`` as int64, one value per tick."""
    if name not in DATASETS:
        msg = f"no shipped data set {name!r} (there are: {', '.join(DATASETS)})"
        raise KeyError(msg)
    with resources.files("stream").joinpath("data", DATASETS[name].file).open("rb") as f, np.load(f) as z:
        return z["values"].astype(np.int64)


def extended(name: str, n: int) -> np.ndarray:
    """The stream extended to ``n`` ticks as the reference code does (append the array reversed, without its first
    element, until it is long enough), as float64."""
    x = load(name).astype(np.float64)
    while x.size < n:
        x = np.concatenate([x, x[::-1][1:]])
    return x[:n]

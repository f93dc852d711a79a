"""Make docs/releases.png: what a stream of releases looks like and how to read it (README, "Reading releases").

    python docs/plot_releases.py            # a few seconds; needs matplotlib

Four hours of one simulated smart meter (one reading a minute, ``tops simulate``), released by ToPS at eps = 1 with
a fixed public theta (no holdout) and r = 4096, b = 4: (a) the per-tick releases against the readings, (b) totals per
hour from ``stream.query`` with their 95 % noise bars against the true hourly totals.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from operators import ToPSConfig  # noqa: E402
from stream.commands.replay import replay  # noqa: E402
from stream.commands.simulate import simulate_values  # noqa: E402
from stream.core.sinks import central_params  # noqa: E402
from stream.query import Releases  # noqa: E402


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = 1440  # one day of minutes
    x = simulate_values(n, seed=3)
    cfg = ToPSConfig(epsilon=1.0, bound=5000, theta=300, query_range=4096, fanout=4)
    rel, op = replay(x, cfg, bytes(range(32)))
    status = {"stream": "m", "phase": "releasing", "theta": op.theta,
              "params": central_params(cfg, op.theta_units, op.smoother_layers, None)}  # what the daemon states
    r = Releases.from_arrays("m", np.arange(n), rel, status)
    hours = r.per(60)
    truth = np.minimum(x, op.theta).reshape(24, 60).sum(axis=1)

    fig, (a, b) = plt.subplots(2, 1, figsize=(8, 5.6))
    sl = slice(6 * 60, 10 * 60)
    ticks = np.arange(n)[sl]
    a.plot(ticks, rel[sl], color="tab:red", lw=0.8, label="release (one per tick)")
    a.plot(ticks, x[sl], color="black", lw=0.8, label="reading")
    a.axhline(0, color="grey", lw=0.5)
    a.set_xlabel(f"tick (minute); a leaf is {op.config.fanout ** op.smoother_layers} ticks")
    a.set_ylabel("Wh")
    a.set_title("(a) per tick: flat predictions, a jump on each leaf's last tick; alone, meaningless", fontsize=9)
    a.legend(fontsize=8, loc="upper left")
    h = np.arange(24)
    b.vlines(h, [w.low for w in hours], [w.high for w in hours], color="tab:red", lw=3, alpha=0.35,
             label="tops query --per 60: 95% interval (the readings clamped to theta)")
    b.plot(h, [w.total for w in hours], "o", color="tab:red", ms=3, label="released hourly total")
    b.plot(h, truth, "k_", ms=10, label="true hourly total (truncated at theta)")
    b.set_xlabel("hour of the day")
    b.set_ylabel("Wh per hour")
    b.set_title("(b) summed over ranges: the releases answer range sums", fontsize=9)
    b.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    out = ROOT / "docs" / "releases.png"
    fig.savefig(out, dpi=90)
    print(f"{out} ({out.stat().st_size // 1024} kB), theta {op.theta:g}, s {op.smoother_layers}")


if __name__ == "__main__":
    main()

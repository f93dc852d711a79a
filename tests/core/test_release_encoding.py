"""Release encoding: a single release is encoded as every release is, and a step's batches together as each
alone, character for character."""

from __future__ import annotations

import json


def test_a_single_release_is_encoded_as_every_release_is() -> None:
    """One release a batch (a stream's reading of a step) is formatted with the step's time and epsilon texts
    shared between batches: the same JSON, character for character, as the general path gives (forced here by a
    second element), for random values, times and thetas, and epsilons that are equal floats."""
    import math
    from types import SimpleNamespace

    import numpy as np

    from stream.core.router import ReleaseBatch
    from stream.core.sinks import encode_releases

    rng = np.random.default_rng(4)
    reprs: dict[float, str] = {}
    times = [1.7e9 + float(x) for x in rng.random(5) * 1e7] + [1795742511.2441952, 1.7e9]
    for i in range(3000):
        rec = SimpleNamespace(name_json=json.dumps(f"m{i}é"))
        t = times[i % len(times)]
        v = float(rng.normal() * 10.0 ** rng.integers(-3, 12)) if i % 7 else -0.0
        theta, eps = float(rng.integers(1, 5000)) * 0.25, [1.0, 0.1 + 0.2, 1e-3][i % 3]
        if i % 11 < 2:  # an int and a float of one value: each its own text (5 == 5.0 in a dict)
            theta = 5 if i % 11 else 5.0
        one = encode_releases(ReleaseBatch(rec, [i], [t], [v], theta), eps, reprs)
        two = encode_releases(ReleaseBatch(rec, [i, i + 1], [t, t + 1.0], [v, v], theta), eps)
        assert one == two[:1]
        assert json.loads(one[0]) == {"stream": f"m{i}é", "tick": i, "ts": t, "value": v, "epsilon": eps,
                                      "theta": theta}
        assert math.copysign(1.0, json.loads(one[0])["value"]) == math.copysign(1.0, v)
    assert len(reprs) <= len(times) + 3 + 5000


def test_a_steps_batches_are_encoded_together_as_each_alone() -> None:
    """``encode_all`` (a step's batches to stdout, without a call per batch for a stream's one release) gives the
    lines of ``encode_releases`` batch by batch, character for character: single releases with times and thetas
    that change or repeat from batch to batch (an int theta and a float one of one value among them), several
    releases a batch, categorical histograms, -0.0 values."""
    from types import SimpleNamespace

    import numpy as np

    from stream.core.router import ReleaseBatch
    from stream.core.sinks import encode_all, encode_releases

    rng = np.random.default_rng(8)
    times = [1795742511.2441952, 1.7e9, 1.7e9 + 0.1]
    for eps in (1.0, 0.1 + 0.2):
        batches = []
        for i in range(2000):
            rec = SimpleNamespace(name_json=json.dumps(f"m{i % 50}é"))
            t = times[int(rng.integers(0, 3))] if i % 5 else times[0]
            v = float(rng.normal() * 10.0 ** rng.integers(-3, 12)) if i % 13 else -0.0
            theta = [5, 5.0, 12.25, float(rng.integers(1, 5000))][int(rng.integers(0, 4))]
            kind = i % 17
            if kind == 3:
                batches.append(ReleaseBatch(rec, [i, i + 1, i + 2], [t, t, t + 1.0], [v, 1.5, v], theta))
            elif kind == 5:
                batches.append(ReleaseBatch(rec, [i], [t], [{"a": 1.5, "b": -0.0}], theta))
            elif kind == 7:
                batches.append(ReleaseBatch(rec, [i], [t], [3], theta))  # an int value: the general path
            else:
                batches.append(ReleaseBatch(rec, [i], [t], [v], theta))
        want = [line for b in batches for line in encode_releases(b, eps)]
        assert encode_all(batches, eps) == want
    assert encode_all([], 1.0) == []


def _row_releases(rng, n_streams: int, values: list[float] | None = None):
    """A step's releases of release rows as columns: random names (some needing JSON escapes), one to three releases
    a stream, times shared or not, thetas as the rows give them (floats), and ``values`` (random ones otherwise)."""
    from json.encoder import encode_basestring_ascii
    from types import SimpleNamespace

    import numpy as np

    from stream.core.router import RowReleases

    alphabet = ['a', 'Z', '0', '_', '"', '\\', '\n', '\x01', 'é', '€', '😀', ' ', '/', '\u2028']
    names = ["".join(alphabet[int(k)] for k in rng.integers(0, len(alphabet), int(rng.integers(1, 12))))
             for _ in range(n_streams)]
    records = [SimpleNamespace(name=n, name_json=encode_basestring_ascii(n)) for n in names]
    counts = rng.integers(1, 4, n_streams).astype(np.int64)
    if values is not None:  # one release a stream, the last stream's the rest
        counts[:] = 1
        counts[-1] = len(values) - (n_streams - 1)
    n = int(counts.sum())
    if values is None:
        kind = rng.integers(0, 6, n)
        grid = rng.integers(-(1 << 31) + 1, 1 << 31, n) / 1024.0
        small = rng.integers(-5000 * 1024, 5000 * 1024, n) / 1024.0
        noisy = rng.normal(size=n) * 10.0 ** rng.integers(-8, 25, n)
        special = np.array([-0.0, 0.0, 1e300, -1e300, 5e-324, 1e16, 1e-5, 2.0 ** 21, -(2.0 ** 21) + 1 / 1024,
                            1048575.9990234375, 123456.0])[rng.integers(0, 11, n)]
        values = np.select([kind == 0, kind == 1, kind == 2, kind == 3], [grid, small, noisy, special],
                           np.round(small)).tolist()
    times = [1795742511.2441952, 1.7e9, 1.7e9 + 0.1, 1e9 + 1 / 3]
    ts = np.array([times[int(k)] for k in rng.integers(0, len(times), n)]) if rng.random() < 0.5 else \
        np.full(n, times[0])
    theta = np.array([float(x) for x in rng.integers(1, 5000 * 4, n_streams) * 0.25])
    first = rng.integers(0, 1 << 40, n_streams).astype(np.int64)
    return RowReleases(records, first, counts, ts, np.array(values, dtype=np.float64), theta)


def test_bulk_encoding_is_byte_for_byte_what_the_per_release_encoder_writes() -> None:
    """A step's release rows written in one buffer (``encode_release_rows``) are the lines ``encode_releases`` writes
    batch by batch, character for character: values on the release grid (written by the compiled encoder) and off
    it (``repr``), -0.0, huge and subnormal values, names that need JSON escapes, shared and distinct times, large
    ticks."""
    import numpy as np

    from stream.core.sinks import encode_release_rows, encode_releases

    rng = np.random.default_rng(36)
    for eps in (1.0, 0.1 + 0.2, 1e-3):
        for n_streams in (1, 2, 17, 3000):
            rows = _row_releases(rng, n_streams)
            want = "".join(line + "\n" for b in rows.batches() for line in encode_releases(b, eps))
            assert encode_release_rows(rows, eps) == want.encode()


def test_every_value_of_the_release_grid_is_written_as_its_repr() -> None:
    """The compiled encoder writes a value ``k / 1024`` below 2^21 itself, as its exact decimal expansion: that is
    ``repr`` for every such value below 2^7 (all of them) and for random ones up to the limit."""
    import numpy as np

    from stream.core.sinks import encode_release_rows, encode_releases

    rng = np.random.default_rng(21)
    every = (np.arange(-(1 << 17), 1 << 17) / 1024.0).tolist()
    spread = (rng.integers(-(1 << 31) + 1, 1 << 31, 100_000) / 1024.0).tolist()
    for values in (every, spread):
        rows = _row_releases(rng, len(values) // 3, values)
        want = "".join(line + "\n" for b in rows.batches() for line in encode_releases(b, 1.0))
        assert encode_release_rows(rows, 1.0) == want.encode()

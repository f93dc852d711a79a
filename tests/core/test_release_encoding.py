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

"""Session 42 probe: one AdaServe stretch's throughput-phase rows by native loops (native_rows.py, compiled
with mypyc) against the numpy path (speculation.path_probabilities + scheduler._throughput_phases).

Build and run (from this folder, with a compiled install of slo-console whose venv runs it):
    /tmp/venv-mypyc/bin/mypyc native_rows.py
    env -u PYTHONPATH VENV/bin/python bench.py 3 8 10 6 139 2          # check equality, then time both
    env -u PYTHONPATH VENV/bin/python bench.py 3 8 10 6 139 2 numpy    # one pass of one way (for callgrind;
                                                                       # also `native`, `none`)
Arguments: depth, width, n requests, K steps, B - n, then 1 (throughput_row: sort) or 2 (throughput_row2:
quickselect). README.md has the figures.
"""

import sys
import time

import native_rows as nr
import numpy as np

from core.control.adaserve.scheduler import _throughput_phases
from core.control.adaserve.speculation import candidate_shape, clip_acceptance, path_probabilities

d, w, n, K, take = (int(arg) for arg in sys.argv[1:6])
ROW = nr.throughput_row2 if sys.argv[6:7] == ["2"] else nr.throughput_row
MODE = sys.argv[7] if len(sys.argv) > 7 else "check"
shape = candidate_shape(d, w)
depths, offsets = shape.distinct_exponents
native = nr.native_shape([int(x) for x in depths], [int(x) for x in offsets], shape.distinct_of.tolist(), shape.size)
rng = np.random.default_rng(1)
budget = take + n


def make() -> tuple[list[float], list[float], list[float]]:
    """One stretch's randomness, laid out as build_stretch lists it (request by request, K steps each)."""
    truth = clip_acceptance(rng.beta(7, 3, (n, K)))
    est = clip_acceptance(truth * rng.uniform(0.9, 1.1, (n, K)))
    return est.ravel().tolist(), truth.ravel().tolist(), rng.random((n, K)).ravel().tolist()


def numpy_way(est: list[float], tru: list[float], uni: list[float]) -> tuple[list, list]:
    cols = np.array(est + tru + uni).reshape(3 * n, K).T
    probs = path_probabilities(shape, cols[:, : 2 * n].ravel(), clipped=True, shared=False)
    verified, emitted = _throughput_phases(shape, probs.reshape(K, 2, n, shape.size), cols[:, 2 * n :], budget)
    return verified.tolist(), emitted.tolist()


def native_way(est: list[float], tru: list[float], uni: list[float]) -> tuple[list, list]:
    rows = [ROW(native, est, tru, uni, k, K, n, take) for k in range(K)]
    return [r and r[0] for r in rows], [r and r[1] for r in rows]


cases = [make() for _ in range(200)]
if MODE != "check":
    way = {"numpy": numpy_way, "native": native_way, "none": lambda *a: None}[MODE]
    for case in cases:
        way(*case)
    sys.exit(0)
declined = 0
for case in cases:
    a, b = numpy_way(*case), native_way(*case)
    for k in range(K):
        if b[0][k] is None:
            declined += 1
        else:
            assert (a[0][k], a[1][k]) == (b[0][k], b[1][k]), k
print("equal; declined", declined, "of", len(cases) * K)
for way in (numpy_way, native_way, numpy_way, native_way):
    start = time.perf_counter()
    for case in cases:
        way(*case)
    print(way.__name__, round((time.perf_counter() - start) / len(cases) * 1e6, 1), "us a stretch of", K, "rows")

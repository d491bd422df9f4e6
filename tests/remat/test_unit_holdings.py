"""The budget model's per-unit holdings, asked at the steps wanted (not a units x steps table)."""

import numpy as np

from onnx_remat.remat.budget_model import UnitHoldings


def dense(spans: list[tuple[int, int, int]], steps: int) -> np.ndarray:
    """What the model used to build for each unit: a difference array over every step."""
    arr = np.zeros(steps + 1, dtype=np.int64)
    for first, last, size in spans:
        arr[first] += size
        arr[last + 1] -= size
    return np.cumsum(arr)[:steps]


def test_unit_holdings_equal_the_dense_timeline_at_every_step():
    rng = np.random.default_rng(7)
    steps = 300
    spans: dict[int, list[tuple[int, int, int]]] = {}
    for unit in range(12):
        found = []
        for _ in range(int(rng.integers(0, 30))):
            first = int(rng.integers(0, steps))
            last = int(rng.integers(first, steps))  # holdings() yields last >= first
            found.append((first, last, int(rng.integers(1, 1 << 40))))
        if found:
            spans[unit] = found
    held = UnitHoldings(spans)
    every = np.arange(steps)
    for unit in range(14):  # 12 and 13 hold nothing, as do units whose draw gave no span
        expected = dense(spans.get(unit, []), steps)
        assert np.array_equal(held.at(unit, every), expected)
        picked = rng.choice(steps, size=20)
        assert np.array_equal(held.at(unit, picked), expected[picked])  # any order, repeats
        assert held.at(unit, [int(picked[0])]).dtype == np.int64


def test_unit_holdings_keep_their_spans_only():
    # three layers' spans over 10^6 steps: what is kept grows with the spans, not with the steps
    spans = {k: [(k * 1000, k * 1000 + 10, 256), (999_000 - k, 999_999, 512)] for k in range(3)}
    held = UnitHoldings(spans)
    kept = sum(a.size for arrays in held._spans.values() for a in arrays)
    assert kept == 3 * (2 + 3 + 2 + 3)
    assert held.at(1, [999, 1000, 1010, 1011, 998_999, 999_999]).tolist() == [0, 256, 256, 0, 512, 512]

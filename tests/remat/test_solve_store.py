"""Rotor tables kept between solves (RotorStore), and kept packed (PackedTable), give the solutions a
fresh solve gives."""

from __future__ import annotations

import dataclasses
import random

import numpy as np

import onnx_remat.remat.solve as solve_module
from onnx_remat.remat.solve import INF, PackedTable, RotorStore, least_budget, min_budget, solve
from tests.remat.test_solve import random_problem


def _key(sol):
    if sol is None:
        return None
    events = [[(e.unit, e.start, e.from_clone, e.holds) for e in c.events] for c in sol.choices]
    return sol.cost, sol.stored, [(c.first, c.last, c.option) for c in sol.choices], events


def test_store_gives_the_solutions_of_fresh_solves():
    rng = random.Random(7)
    for _ in range(20):
        problem = random_problem(rng, rng.randint(2, 9))
        store = RotorStore()
        for _round in range(4):
            budget = rng.randint(10, 150)
            assert _key(solve(problem, budget, quantum=1, store=store)) == _key(solve(problem, budget, quantum=1))
            # the budget planner's rounds: a unit's figures corrected between solves
            k = rng.randrange(len(problem.units))
            unit = problem.units[k]
            if unit.layer is not None:
                cost, need, kept = unit.layer
                unit = dataclasses.replace(unit, layer=(cost, need + rng.randint(-3, 3), kept + rng.randint(-2, 2)))
            problem.units[k] = dataclasses.replace(unit, advance=unit.advance + rng.randint(0, 3))


def test_least_budget_returns_the_solution_at_min_budget():
    rng = random.Random(3)
    for _ in range(10):
        problem = random_problem(rng, rng.randint(2, 8))
        found = least_budget(problem, 1, 200, tolerance=1, quantum=1)
        least = min_budget(problem, 1, 200, tolerance=1, quantum=1)
        if found is None:
            assert least is None
            continue
        assert found[0] == least
        assert _key(found[1]) == _key(solve(problem, least, quantum=1))


def test_packed_tables_unpack_to_the_same_arrays():
    rng = np.random.default_rng(5)
    for size in (0, 1, 2, 7, 64):
        for _ in range(30):
            lo, hi = sorted(rng.integers(0, size + 1, 2)) if size else (0, 0)
            val = np.full(size, INF)
            val[lo:hi] = rng.choice([INF, 0.5, 1.25, 3.0], hi - lo)
            val[hi:] = rng.choice([INF, 0.25])
            split = np.where(val < INF, rng.integers(0, 5, size), -1).astype(np.int32)
            split[hi:] = -1 if val[hi:].size and val[-1] == INF else 2  # the run of equal levels
            packed = PackedTable.pack(val, split, 9)
            back_val, back_split = packed.unpack_val(), packed.unpack_split()
            assert back_val.dtype == val.dtype and np.array_equal(back_val, val)
            assert back_split.dtype == split.dtype and np.array_equal(back_split, split)
            assert packed.id == 9 and len(packed.val) <= max(hi - lo, 0)  # only the levels between


def test_a_solve_reading_its_tables_back_packed_gives_the_same_solutions(monkeypatch):
    """With one table kept unpacked, every table a solve reads again is unpacked first."""
    rng = random.Random(11)
    problems = [random_problem(rng, rng.randint(2, 9)) for _ in range(12)]
    budgets = [rng.randint(10, 150) for _ in problems]
    wide = [_key(solve(p, b, quantum=1)) for p, b in zip(problems, budgets)]
    monkeypatch.setattr(solve_module, "RECENT_TABLES", 1)
    assert [_key(solve(p, b, quantum=1)) for p, b in zip(problems, budgets)] == wide

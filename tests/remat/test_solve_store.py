"""Rotor tables kept between solves (RotorStore) give the solutions a fresh solve gives."""

from __future__ import annotations

import dataclasses
import random

from onnx_remat.remat.solve import RotorStore, least_budget, min_budget, solve
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

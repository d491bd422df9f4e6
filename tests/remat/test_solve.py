"""The budget planner's solvers on numbers: the dynamic programme is exact (against brute force
over every schedule, and against the HiGHS integer programme of the same model)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from onnx_remat.remat.solve import (
    Choice,
    Event,
    Problem,
    Solution,
    UnitSpec,
    min_budget,
    predict,
    solution_cost,
    solve,
    solve_milp,
)


def random_problem(rng: random.Random, n: int, chain: bool = True) -> Problem:
    units = []
    for _ in range(n):
        layer = (rng.uniform(0.5, 2.0), rng.randint(8, 20), rng.randint(0, 3))
        options = [
            (0.0, rng.randint(8, 16), rng.randint(6, 12)),
            (rng.uniform(0.1, 0.6), rng.randint(8, 18), rng.randint(2, 8)),
        ]
        options.append(layer)
        units.append(
            UnitSpec(
                fw_need=rng.randint(4, 10),
                boundary=rng.randint(1, 4),
                options=options,
                joins_next=chain,
                layer=layer,
                forward_cost=rng.uniform(1.0, 3.0),
                advance=rng.randint(2, 8),
                event_ext=rng.randint(2, 8),
                hold=rng.randint(1, 4),
                input_extra=rng.choice([0, 0, 2]),
            )
        )
    units[-1].joins_next = False
    return Problem(units, mid_need=rng.randint(2, 10), outside_need=rng.randint(0, 5), max_group=n)


def split_trees(a: int, b: int, from_clone: bool):
    """Every rotor schedule of group a..b, as the solver writes them."""
    if a == b:
        yield [Event(b, a - 1, from_clone)]
        return
    for s in range(a, b):
        for right in split_trees(s + 1, b, True):
            for left in split_trees(a, s, from_clone):
                first = right[0]
                merged = [Event(first.unit, a - 1, from_clone, [s, *first.holds]), *right[1:]]
                yield merged + left


def all_solutions(problem: Problem):
    n = len(problem.units)

    def rest(k: int):
        if k == n:
            yield []
            return
        for i in range(len(problem.units[k].options)):
            for tail in rest(k + 1):
                yield [Choice(k, k, option=i), *tail]
        b = k
        while b + 1 < n and problem.units[b].joins_next and b - k + 2 <= problem.max_group:
            b += 1
            for events in split_trees(k, b, False):
                for tail in rest(b + 1):
                    yield [Choice(k, b, events=events), *tail]

    for choices in rest(0):
        yield Solution(0.0, choices, 0, 0)


@pytest.mark.parametrize("seed", range(12))
def test_dp_is_exact_against_every_schedule(seed):
    rng = random.Random(seed)
    problem = random_problem(rng, rng.randint(2, 4))
    budgets = [rng.randint(20, 60) for _ in range(4)]
    sols = list(all_solutions(problem))
    assert sols
    for budget in budgets:
        fits = [s for s in sols if max(v for v, _ in predict(problem, s).values()) <= budget]
        if problem.outside_need > budget:
            fits = []
        best = min((solution_cost(problem, s) for s in fits), default=None)
        got = solve(problem, budget, quantum=1)
        if best is None:
            assert got is None
            continue
        assert got is not None
        assert got.cost == pytest.approx(best)
        assert solution_cost(problem, got) == pytest.approx(got.cost)
        assert max(v for v, _ in predict(problem, got).values()) <= budget


@pytest.mark.parametrize("seed", range(8))
def test_dp_and_milp_agree(seed):
    rng = random.Random(100 + seed)
    problem = random_problem(rng, rng.randint(3, 7), chain=rng.random() < 0.8)
    for budget in (rng.randint(20, 80) for _ in range(3)):
        dp = solve(problem, budget, quantum=1)
        ilp = solve_milp(problem, budget, quantum=1)
        assert (dp is None) == (ilp is None)
        if dp is not None and ilp is not None:
            assert dp.cost == pytest.approx(ilp.cost)
            assert max(v for v, _ in predict(problem, ilp).values()) <= budget


def test_more_budget_never_costs_more():
    problem = random_problem(random.Random(7), 6)
    costs = [s.cost for s in (solve(problem, b, quantum=1) for b in range(10, 120, 5)) if s is not None]
    assert costs == sorted(costs, reverse=True)


def test_min_budget_is_the_least_feasible():
    problem = random_problem(random.Random(3), 5)
    least = min_budget(problem, 1, 200, tolerance=1, quantum=1)
    assert least is not None
    assert solve(problem, least, quantum=1) is not None
    assert solve(problem, least - 1, quantum=1) is None


def test_rotor_beats_staged_and_chen_schedules():
    """On a uniform chain, at every budget where staged recompute (every unit from the group's
    input: --recompute-outputs) or Chen's (every boundary recomputed once and held) fits, the
    solver's plan costs no more."""
    unit = dict(fw_need=4, boundary=4, joins_next=True, forward_cost=1.0, advance=4, event_ext=0, hold=4)
    layer = (1.0, 10, 0)
    units = [UnitSpec(options=[(0.0, 10, 30), layer], layer=layer, **unit) for _ in range(6)]  # type: ignore[arg-type]
    units[-1].joins_next = False
    problem = Problem(units, mid_need=0, max_group=6)
    staged = Solution(
        0, [Choice(0, 5, events=[Event(m, -1, False, [m - 1] if m else []) for m in range(5, -1, -1)])], 0, 0
    )
    chen = Solution(
        0,
        [
            Choice(
                0, 5, events=[Event(5, -1, False, [0, 1, 2, 3, 4])] + [Event(m, m - 1, m > 0) for m in range(4, -1, -1)]
            )
        ],
        0,
        0,
    )
    checked = 0
    for budget in range(10, 60):
        got = solve(problem, budget, quantum=1)
        for ref in (staged, chen):
            if max(v for v, _ in predict(problem, ref).values()) <= budget:
                assert got is not None and got.cost <= solution_cost(problem, ref) + 1e-9
                checked += 1
    assert checked > 10
    tight = solve(problem, 22, quantum=1)
    assert tight is not None and tight.cost < solution_cost(problem, staged)


def test_descending_reads_the_clipped_table():
    """The DP reads a group's rotor table at H = top - S for S = 0..hi, clipped to the table: as
    slices, the same values as the index array clipped."""
    from onnx_remat.remat.solve import _descending

    rng = np.random.default_rng(0)
    for length in (1, 2, 5, 17):
        table = rng.random(length)
        for top in range(-25, 45):
            for hi in range(30):
                clipped = table[np.clip(top - np.arange(hi + 1), 0, length - 1)]
                assert np.array_equal(_descending(table, top, hi), clipped), (length, top, hi)


def _with_role_needs(rng: random.Random, problem: Problem) -> Problem:
    """``problem`` with each unit's first and last need absent, equal to its layer's or another."""
    for u in problem.units:
        assert u.layer is not None
        u.first_need = rng.choice([None, u.layer[1], u.layer[1] + rng.randint(1, 6)])
        u.last_need = rng.choice([None, u.layer[1], u.layer[1] - rng.randint(1, 4)])
    return problem


@pytest.mark.parametrize("seed", range(6))
def test_table_keys_drop_only_flags_that_change_nothing(seed, monkeypatch):
    """A rotor table's key leaves out a start (end) flag where the group's first (last) unit needs
    what its layer needs: every table, and every solve, is the one made with every flag kept."""
    from onnx_remat.remat.solve import _Tables

    rng = random.Random(300 + seed)
    problem = _with_role_needs(rng, random_problem(rng, 6))
    collapsed = _Tables(problem.units, 1, 60)
    every_flag = _Tables(problem.units, 1, 60)
    every_flag.key = lambda a, b, start, end: (a, b, start, end)  # type: ignore[method-assign]
    for a in range(6):
        for b in range(a, 6):
            for start in (False, True):
                for end in (False, True):
                    val, split = collapsed.get(a, b, start, end)
                    want_val, want_split = every_flag.get(a, b, start, end)
                    assert np.array_equal(val, want_val), (a, b, start, end)
                    assert np.array_equal(split, want_split), (a, b, start, end)
    assert len(collapsed.cache) < len(every_flag.cache)
    budgets = list(range(20, 70, 2))  # (tight budgets take rotor groups)
    got = [solve(problem, budget, quantum=1) for budget in budgets]
    monkeypatch.setattr(_Tables, "key", lambda self, a, b, start, end: (a, b, start, end))
    assert [solve(problem, budget, quantum=1) for budget in budgets] == got
    assert any(s is not None and any(c.events for c in s.choices) for s in got)


def test_the_install_builds_the_compiled_solver_loops():
    from onnx_remat import compiled as native

    assert native.compiled(native.rotor_table) is not None


@pytest.mark.parametrize("seed", range(10))
def test_compiled_loops_solve_as_python_does(seed, monkeypatch):
    """The rotor tables and the dynamic programme's steps in C (onnx_remat/compiled/rotor_table.c)
    give every table, split and solution exactly as the Python loops do: costs compared as floats,
    not approximately."""
    from onnx_remat.remat.solve import _Tables

    rng = random.Random(500 + seed)
    n = rng.randint(3, 9)
    problem = _with_role_needs(rng, random_problem(rng, n, chain=rng.random() < 0.8))
    if seed % 2:  # whole costs: many plans cost the same, and the first found must stay the one kept
        for u in problem.units:
            u.options = [(float(round(c)), need, kept) for c, need, kept in u.options]
            assert u.layer is not None
            u.layer = (float(round(u.layer[0])), u.layer[1], u.layer[2])
            u.forward_cost = float(round(u.forward_cost))
    problem.max_group = rng.randint(2, n)
    budgets = list(range(15, 90, 3))
    quantum = rng.choice([1, 1, 2, 3])
    compiled_tables = _Tables(problem.units, quantum, 40)
    compiled = [solve(problem, budget, quantum=quantum) for budget in budgets]
    monkeypatch.setenv("ONNX_REMAT_NATIVE", "0")
    python_tables = _Tables(problem.units, quantum, 40)
    for a in range(n):
        for b in range(a, min(n, a + problem.max_group)):
            for start in (False, True):
                for end in (False, True):
                    monkeypatch.setenv("ONNX_REMAT_NATIVE", "1")
                    got = compiled_tables.get(a, b, start, end)
                    monkeypatch.setenv("ONNX_REMAT_NATIVE", "0")
                    want = python_tables.get(a, b, start, end)
                    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]), (a, b, start, end)
    assert [solve(problem, budget, quantum=quantum) for budget in budgets] == compiled
    assert any(s is not None for s in compiled)


def test_compiled_loops_refuse_what_does_not_fit():
    from onnx_remat import compiled as native

    kernel = native.compiled(native.rotor_table)
    assert kernel is not None
    val, split = np.full(5, np.inf), np.full(5, -1, dtype=np.int32)
    table = np.zeros(5)
    with pytest.raises(ValueError):
        kernel.table([(1.0, 5, 0, table, table)], val, split)  # lo past the last level
    with pytest.raises(ValueError):
        kernel.table([(1.0, 2, 3, table, table)], val, split)  # holds more than its headroom
    with pytest.raises(ValueError):
        kernel.table([(1.0, 1, 0, table[:3], table)], val, split)  # a table shorter than this one
    best = np.full((2, 5), np.inf)
    code, prev = np.zeros((2, 5), dtype=np.int64), np.zeros((2, 5), dtype=np.int64)
    with pytest.raises(ValueError):
        kernel.relax(best, code, prev, 4, 2, 0, 0, 4, 0, 1.0, 0)  # no row 2
    assert np.isinf(best).all()

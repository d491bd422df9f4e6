"""Least added compute under a memory budget, on the budget planner's chain model: exact solvers.

The problem (numbers only; :mod:`onnx_remat.remat.budget_model` derives them from a graph): units
``0..n-1`` in forward order. Each unit is either treated on its own, by one of its *options*
(cost ``c``, memory ``need`` while its backward runs, bytes ``kept`` past its forward pass), or
belongs to a *group*: a run of consecutive units that chain (``joins_next``), every one of them
recomputed as a whole (its ``layer`` option) and their boundaries (block outputs) not stored but
recomputed from the group's input. Whatever a unit keeps, and its boundary when stored, stays in
memory while every later unit runs, forward and backward; so with ``S_k`` the bytes units before
``k`` keep, the plan fits budget ``B`` when

* ``S_k + fw_need_k <= B`` (forward of unit k, its input included when it is not stored),
* ``S_k + need_k <= B`` for a unit on its own (its backward, its recompute included),
* ``S_n + mid_need <= B`` (between the forward and the backward pass), ``outside_need <= B``,
* for a group, its rotor schedule fits the headroom ``B - S_a - kept of the group``.

**Rotor schedules** (Griewank's revolve / Beaumont et al.'s Rotor, on this rewrite's terms): the
backward pass of group ``a..b`` with ``o_{a-1}`` available and headroom ``M`` costs

    rot(a, a, M) = layer cost of a                   if need_a <= M
    rot(a, b, M) = min over a <= s < b of  F(a..s) + rot(s+1, b, M - o_s) + rot(a, s, M)

when the backward pass reaches unit ``b``, recompute forward from ``o_{a-1}`` to ``o_s`` (cost
``F``, the units' full forward), keep ``o_s``, do ``s+1..b``, then ``a..s``. It covers per-layer
recompute inside the group (all splits at ``s = b-1`` from a stored input: staged groups, what
``--recompute-outputs`` does), Chen et al.'s checkpoints (boundaries recomputed once and kept)
and everything between; the rewrite runs it as one segment per unit (:mod:`onnx_remat.remat.budget`).

**Solvers.** :func:`solve` is an exact dynamic programme over the units in forward order whose
state is ``S`` (bytes, in quanta of ``quantum``; sizes rounded up, the budget down, so a plan it
returns fits the model): O(n x (options + G^2) x B/quantum) for groups of at most G units, and
``rot`` tables are shared by every group ending at the same unit. It is used because the
structure *is* a chain (nested lifetimes make the constraints prefix sums) and it is linear in the
chain length (a 20,000-node graph plans in a second). :func:`solve_milp` states the same model as
a 0-1 integer programme, one column per unit option and per group with each distinct rotor
schedule, solved by HiGHS (``scipy.optimize.milp``); it is the reference the tests check the
dynamic programme against, and the formulation to extend where units' lifetimes do not nest
(constraints are then per step rather than prefix sums).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from onnx_remat import compiled as native

INF = float("inf")
RECENT_TABLES = 2048  # rotor tables a solve keeps unpacked (:class:`PackedTable`): 50 MiB at 3,850 layers


@dataclass
class UnitSpec:
    """One unit of the chain model (bytes; costs in seconds)."""

    fw_need: int
    boundary: int  # bytes of its boundary stored when the unit ends a group or stands alone
    options: list[tuple[float, int, int]]  # (cost, need, kept) of each option on its own
    joins_next: bool = False
    layer: tuple[float, int, int] | None = None  # (cost, need, kept) of the whole-unit recompute
    forward_cost: float = 0.0  # recompute of the unit's boundary from its input
    advance: int = 0  # bytes alive inside the unit during that recompute (its boundary included)
    event_ext: int = 0  # bytes alive (the units before excluded) when the backward reaches the unit
    hold: int = -1  # bytes of its boundary when a rotor group recomputes and holds it (-1: boundary)
    first_need: int | None = None  # ``need`` of its whole-unit recompute when a group starts here
    last_need: int | None = None  # ... when a group ends here
    input_extra: int = 0  # bytes kept alive to store its input when a group starts here (an input
    # not stored for the backward pass anyway, e.g. a block output only its successor's transpose stores)

    @property
    def held(self) -> int:
        return self.boundary if self.hold < 0 else self.hold


@dataclass
class Problem:
    units: list[UnitSpec]
    mid_need: int = 0
    outside_need: int = 0
    max_group: int = 12


@dataclass
class Event:
    """One recompute of a group's schedule, run when the backward pass reaches ``unit``: forward from
    the boundary of ``start`` (``start == unit - 1`` and ``from_clone`` False: a stored input), keep
    the boundaries of ``holds``, then recompute ``unit`` itself."""

    unit: int
    start: int
    from_clone: bool
    holds: list[int] = field(default_factory=list)


@dataclass
class Choice:
    """What the solution does with units ``first..last``: ``option`` (an index into the unit's
    options) for one unit on its own, or a group with its schedule ``events`` (``option`` None)."""

    first: int
    last: int
    option: int | None = None
    events: list[Event] = field(default_factory=list)


@dataclass
class Solution:
    cost: float
    choices: list[Choice]
    stored: int  # bytes kept past the forward pass (model), in quanta
    budget: int

    def option_of(self, unit: int) -> int | None:
        for c in self.choices:
            if c.first <= unit <= c.last:
                return c.option
        return None


def _q(x: int, quantum: int) -> int:
    # to the nearest quantum: the model is checked exactly afterwards, and rounding every figure
    # up would make a plan that fits exactly look over the budget
    return (int(x) + quantum // 2) // quantum


class RotorStore:
    """Rotor table entries kept from one :func:`solve` to the next, by what each is computed from.

    The budget planner solves the same budget a few times, between them correcting the figures of
    a few units (:meth:`onnx_remat.remat.budget.BudgetPlanner.learn`): an entry none of whose units
    changed is the same table, so it is taken rather than computed again. An entry is keyed by the
    exact numbers it is computed from (its units' quantized figures, the forward costs it adds and
    the ids of the entries it combines), so a table taken is the table the solve would compute.
    Only the entries of the latest solve are kept (a table has one entry per group of units).
    """

    def __init__(self) -> None:
        self.shape: tuple[int, int] | None = None  # (quantum, table length) the entries are for
        self.entries: dict[tuple, PackedTable] = {}  # key -> the table, packed
        self.ids = itertools.count()  # an entry's id names it in the keys of the entries combining it

    def for_shape(self, quantum: int, K: int) -> dict[tuple, PackedTable]:
        """The entries for tables of ``K + 1`` levels of ``quantum`` bytes (none for another shape)."""
        if self.shape != (quantum, K):
            self.shape, self.entries = (quantum, K), {}
        return self.entries

    def keep(self, used: set[tuple]) -> None:
        """Forget the entries the latest solve did not use."""
        self.entries = {k: v for k, v in self.entries.items() if k in used}


class PackedTable:
    """A rotor table entry as a solve and :class:`RotorStore` keep it: only the levels between the
    infeasible ones it starts with (cost INF, split -1) and the run of equal levels it ends with,
    which hold nearly all of a table's length. :meth:`unpack` gives the same arrays back."""

    __slots__ = ("id", "lo", "size", "split", "tail", "val")

    def __init__(self, size: int, lo: int, val: np.ndarray, split: np.ndarray, tail: tuple[float, int], id: int):
        self.size, self.lo, self.val, self.split, self.tail, self.id = size, lo, val, split, tail, id

    @classmethod
    def pack(cls, val: np.ndarray, split: np.ndarray, id: int) -> PackedTable:
        """``val`` and ``split`` (one rotor table) packed, with the entry's ``id``."""
        size = len(val)
        if not size:
            return cls(0, 0, val, split, (INF, -1), id)
        # (argmax finds the first True: no index arrays made; a table is packed as it is made)
        feasible = val < INF
        lo = int(feasible.argmax()) if feasible[-1] or feasible.any() else size
        if lo and (split[:lo] != -1).any():
            lo = 0
        differs = val != val[-1]
        differs |= split != split[-1]
        last = size - 1 - int(differs[::-1].argmax())
        hi = max(last + 1 if differs[last] else 0, lo)
        tail = (float(val[-1]), int(split[-1]))
        return cls(size, lo, val[lo:hi].copy(), split[lo:hi].copy(), tail, id)

    def unpack_val(self) -> np.ndarray:
        """The table's costs, as they were packed."""
        val = np.empty(self.size)
        hi = self.lo + len(self.val)
        val[: self.lo] = INF
        val[self.lo : hi] = self.val
        val[hi:] = self.tail[0]
        return val

    def unpack_split(self) -> np.ndarray:
        """The table's splits, as they were packed."""
        split = np.empty(self.size, dtype=np.int32)
        hi = self.lo + len(self.split)
        split[: self.lo] = -1
        split[self.lo : hi] = self.split
        split[hi:] = self.tail[1]
        return split


class _Tables:
    """Rotor tables ``rot(a, b)`` over the absolute headroom ``H`` (quanta), computed on demand.

    ``H`` is the budget minus what the units before the group keep, plus ``P[a]``: the kept bytes
    of the units before ``a`` counted from the chain's start (``P``), so that one table serves
    every group containing ``a..b`` (a unit's backward sees the kept bytes of the group's units
    before it: ``P[m] - P[group start]``). ``store``: entries from earlier solves (:class:`RotorStore`).
    """

    def __init__(self, units: list[UnitSpec], quantum: int, K: int, store: RotorStore | None = None):
        self.u = units
        self.q = quantum
        self.b = [_q(u.held, quantum) for u in units]
        # Per unit, quantized once, as Python numbers: a table of a group reads them for each split
        # (numpy scalars cost a microsecond an operation there).
        self.advance = [_q(u.advance, quantum) for u in units]
        self.event_ext = [_q(u.event_ext, quantum) for u in units]
        self.F = np.cumsum([0.0] + [u.forward_cost for u in units])
        self.forward = self.F.tolist()  # (the same float64 values)
        kept = [_q(u.layer[2], quantum) if u.layer else 0 for u in units]
        self.P = np.concatenate([[0], np.cumsum(kept)]).astype(np.int64)
        # Corrections learnt from the exact estimate can make a unit's kept bytes negative, so P is
        # not always increasing: the table spans the largest P, not the last one.
        self.K = K + max(int(self.P.max()), 0)
        self.kept_before = self.P.tolist()
        self.H = np.arange(self.K + 1)
        self.store = store if store is not None else RotorStore()
        self.shared = self.store.for_shape(quantum, self.K)
        self.used: set[tuple] = set()  # keys of the shared entries this solve uses
        # By position, packed: (cost over H, best split over H relative to a, id in the store). The
        # tables are nearly all INF then one repeated level: unpacked, the 16,638 of 3,850 layers
        # took 390 MiB, the largest part of the command's peak. The costs of the latest made or read
        # stay unpacked (``recent``): a table is read by the tables of the groups around it.
        self.cache: dict[tuple[int, int, bool, bool], PackedTable] = {}
        self.recent: dict[int, np.ndarray] = {}  # by id in the store: equal layers share tables
        # Whether a group's first (last) unit needs other bytes there than inside a group
        # (:func:`_role_need`): where it does not, the flag names the same table as without it, and
        # the key drops it (with four keys per group, 3,850 layers made 165,000 keys for 16,600
        # distinct tables, each key walking its splits; now 46,000).
        self.start_differs = [_first_differs(u) for u in units]
        self.end_differs = [_last_differs(u) for u in units]

    def get(self, a: int, b: int, start: bool = True, end: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """(cost over H, best split over H: ``s - a`` for the split after unit ``s``, -1 for the base
        case); ``start``: ``a`` starts the group (its input is stored, not held); ``end``: ``b`` ends
        it (the unit after it is not in the group)."""
        key = self.key(a, b, start, end)
        val = self.cost(*key)
        return val, self.cache[key].unpack_split()

    def cost(self, a: int, b: int, start: bool = True, end: bool = True) -> np.ndarray:
        """The cost over H of :meth:`get`, without the splits."""
        key = self.key(a, b, start, end)
        self._entry(key)
        return self._val(key)

    def key(self, a: int, b: int, start: bool, end: bool) -> tuple[int, int, bool, bool]:
        """The cache key of table ``(a, b, start, end)``: a flag that changes no need is dropped
        (``start`` reaches only unit ``a``'s own table, ``end`` only unit ``b``'s)."""
        if a == b:
            # one unit: its need is the first need, else the last, else the layer's (_role_need)
            if start and self.start_differs[a]:
                return (a, a, True, False)
            if end and self.end_differs[a] and not (start and self.u[a].first_need is not None):
                return (a, a, False, True)
            return (a, a, False, False)
        return (a, b, start and self.start_differs[a], end and self.end_differs[b])

    def _entry(self, key: tuple[int, int, bool, bool]) -> int:
        """The id in the store of the table ``get`` reads for ``key`` (made, packed, if need be).
        A table found in the store is not unpacked: a group's table reads its parts' ids, and only
        the tables made anew read their parts' costs."""
        packed = self.cache.get(key)
        if packed is not None:
            return packed.id
        return self._make(key)

    def _make(self, key: tuple[int, int, bool, bool]) -> int:
        """:meth:`_entry` for a key not in the cache yet."""
        a, b, start, end = key
        K = self.K
        splits: list[tuple] = []
        if a == b:
            cost, need, _ = self.u[a].layer  # type: ignore[misc]
            need = _role_need(self.u[a], start, end, need)
            content: tuple = ("unit", _q(need, self.q) + self.kept_before[a], cost)
        else:
            # the splits s = a, a+1, ... while feasible somewhere: (forward cost a..s, least H,
            # o_s, the tables s+1..b and a..s), the tables named by their ids in the store
            held, advance, forward = self.b, self.advance, self.forward
            ev = self.event_ext[b] + self.kept_before[b]
            adv = 0
            tkey = self.key
            for s in range(a, b):
                step = advance[s] + (held[s - 1] if s > a else 0)
                adv = max(adv, step)
                lo = max(ev + adv, held[s], 0)
                if lo > K:
                    break
                right, left = tkey(s + 1, b, False, end), tkey(a, s, start, False)
                splits.append((forward[s + 1] - forward[a], lo, held[s], right, left))
            # (the parts' ids inline: nearly every part is in the cache already, and a call per
            # part was a third of a 3,850-layer solve)
            cache, make = self.cache, self._make
            parts: list[tuple] = ["group"]  # type: ignore[list-item]
            for f, lo, o, right, left in splits:
                r = cache.get(right)
                r_id = r.id if r is not None else make(right)
                le = cache.get(left)
                parts.append((f, lo, o, r_id, le.id if le is not None else make(left)))
            content = tuple(parts)
        self.used.add(content)
        found = self.shared.get(content)
        if found is None:
            val, split = self._table(splits) if a < b else self._unit_table(content)
            found = self.shared[content] = PackedTable.pack(val, split, next(self.store.ids))
            self._remember(found.id, val)
        self.cache[key] = found
        return found.id

    def _val(self, key: tuple[int, int, bool, bool]) -> np.ndarray:
        """The costs of the table made for ``key`` (by :meth:`_entry`)."""
        packed = self.cache[key]
        val = self.recent.get(packed.id)
        if val is None:
            val = self._remember(packed.id, packed.unpack_val())
        return val

    def _remember(self, id: int, val: np.ndarray) -> np.ndarray:
        if len(self.recent) >= RECENT_TABLES:
            self.recent.clear()  # (reads are near the latest tables made: the next ones come back)
        self.recent[id] = val
        return val

    def _unit_table(self, content: tuple) -> tuple[np.ndarray, np.ndarray]:
        """One unit recomputed on its own: ``cost`` where ``H`` reaches its need."""
        _, need, cost = content
        return np.where(need <= self.H, cost, INF), np.full(self.K + 1, -1, dtype=np.int32)

    def _table(self, splits: list) -> tuple[np.ndarray, np.ndarray]:
        """The least cost over the splits, per ``H``, and the first split reaching it."""
        K = self.K
        if not splits:
            return np.full(K + 1, INF), np.full(K + 1, -1, dtype=np.int32)
        val = np.full(K + 1, INF)
        split = np.full(K + 1, -1, dtype=np.int32)
        kernel = native.compiled(native.rotor_table)
        if kernel is not None:  # the same walk in C (onnx_remat/compiled/rotor_table.c)
            kernel.table([(f, lo, o, self._val(r), self._val(le)) for f, lo, o, r, le in splits], val, split)
            return val, split
        cand, better = np.empty(K + 1), np.empty(K + 1, dtype=bool)
        for i, (f, lo, o, right, left) in enumerate(splits):
            # H - o_s indexes right (o_s is held while s+1..b run); H indexes left; below lo: infeasible
            row = cand[lo:]
            np.add(self._val(right)[lo - o : K + 1 - o], f, out=row)
            np.add(row, self._val(left)[lo:], out=row)
            # a running minimum, kept where strictly lower: the first split of least cost (a
            # column-wise argmin over the splits' rows read them with a stride: twice as long)
            kept, lower = val[lo:], better[lo:]
            np.less(row, kept, out=lower)
            np.copyto(kept, row, where=lower)
            np.copyto(split[lo:], i, where=lower)
        return val, split

    def events(self, a: int, b: int, H: int, from_clone: bool, start: bool = True, end: bool = True) -> list[Event]:
        """The schedule behind ``rot(a, b, H)``, in the order the backward pass runs it."""
        _, split = self.get(a, b, start, end)
        r = int(split[H])
        if a == b or r < 0:
            return [Event(unit=b, start=a - 1, from_clone=from_clone)]
        s = a + r
        right = self.events(s + 1, b, H - self.b[s], True, False, end)
        first = right[0]  # the event at unit b: it now starts at a - 1 and keeps o_s on the way
        first.start, first.from_clone = a - 1, from_clone
        first.holds = [s, *first.holds]
        return right + self.events(a, s, H, from_clone, start, False)


def _first_differs(u: UnitSpec) -> bool:
    """Whether a group starting at ``u`` needs other bytes there than its layer recompute."""
    return u.first_need is not None and (u.layer is None or u.first_need != u.layer[1])


def _last_differs(u: UnitSpec) -> bool:
    """Whether a group ending at ``u`` needs other bytes there than its layer recompute."""
    return u.last_need is not None and (u.layer is None or u.last_need != u.layer[1])


def _role_need(u: UnitSpec, start: bool, end: bool, need: int) -> int:
    if start and u.first_need is not None:
        return u.first_need
    if end and u.last_need is not None:
        return u.last_need
    return need


def role_key(m: int, a: int, b: int) -> int:
    """The key of a group unit's need by its place: -2 first, -3 last, -1 between."""
    return -2 if m == a else (-3 if m == b else -1)


def quantum_for(budget: int, steps: int = 2048) -> int:
    """A memory quantum giving about ``steps`` levels up to ``budget`` (at least 256 bytes)."""
    return max(256, math.ceil(budget / steps / 256) * 256)


def _quantized(problem: Problem, budget: int, quantum: int | None, store: RotorStore | None = None):
    """The quantum, the budget in quanta, the rotor tables, each unit's boundary and kept bytes in
    quanta: what :func:`solve` and :func:`solve_milp` share."""
    q = quantum or quantum_for(budget)
    K = budget // q
    units = problem.units
    tables = _Tables(units, q, K, store)
    b = [_q(u.boundary, q) for u in units]
    kept_run = [_q(u.layer[2], q) if u.layer else 0 for u in units]
    return q, K, tables, b, kept_run


def _group_starts(problem: Problem, k: int):
    """First units ``a < k`` of the rotor groups ``a..k`` that end at layer ``k``, nearest first."""
    units = problem.units
    a = k
    while a > 0 and k - a + 1 < problem.max_group and units[a - 1].joins_next and units[a - 1].layer:
        a -= 1
        yield a


def solve(
    problem: Problem, budget: int, quantum: int | None = None, store: RotorStore | None = None
) -> Solution | None:
    """The cheapest plan fitting ``budget`` bytes in the model, or None when none does.

    ``store``: rotor tables of earlier solves to take where they are the same (:class:`RotorStore`);
    it is given the tables of this one.
    """
    if problem.outside_need > budget:
        return None
    q, K, tables, b, kept_run = _quantized(problem, budget, quantum, store)
    try:
        return _solve(problem, budget, q, K, tables, b, kept_run)
    finally:
        tables.store.keep(tables.used)


def _solve(problem: Problem, budget: int, q: int, K: int, tables: _Tables, b: list[int], kept_run: list[int]):
    """:func:`solve`'s dynamic programme over the units, with the quantized figures."""
    units = problem.units
    n = len(units)
    hb = tables.b
    fw_need = [_q(u.fw_need, q) for u in units]  # (read for every group a unit is in)
    kept_before = tables.kept_before
    # One block per table, a row per unit boundary: freed whole when the solve returns (as n + 1
    # separate rows, each below malloc's mmap threshold, they stayed in the heap after it: +0.2 GiB
    # of resident memory for the rest of a 3,850-layer command).
    best = np.full((n + 1, K + 1), INF)
    best[0][0] = 0.0
    code = np.full((n + 1, K + 1), -(10**9), dtype=np.int64)
    prev = np.full((n + 1, K + 1), -1, dtype=np.int64)

    levels = np.arange(K + 1)
    kernel = native.compiled(native.rotor_table)

    def relax(k_to: int, k_from: int, add: int, lim: int, cost: np.ndarray | float, c: int, top: int = 0) -> None:
        """best[k_to][S + add] <- best[k_from][S] + cost for 0 <= S <= lim, where that is less;
        ``cost``: a float, or a rotor table read at H = top - S (clipped to the table)."""
        if kernel is not None:  # the same step in C (onnx_remat/compiled/rotor_table.c)
            kernel.relax(best, code, prev, K, k_to, k_from, add, lim, c, cost, top)
            return
        add = max(add, 0)  # a negative correction must not index from the end: count it as nothing kept
        hi = min(lim, K - add)
        if hi < 0:
            return
        cand = best[k_from, : hi + 1] + (_descending(cost, top, hi) if isinstance(cost, np.ndarray) else cost)
        span = slice(add, add + hi + 1)
        dst = best[k_to, span]
        better = cand < dst
        # (in place, where better: no arrays made for the rows' other levels, 57,000 times a solve)
        np.copyto(dst, cand, where=better)
        np.copyto(code[k_to, span], c, where=better)
        np.copyto(prev[k_to, span], levels[: hi + 1], where=better)

    for k, u in enumerate(units):
        fw = _q(u.fw_need, q)
        for oi, (cost, need, kept) in enumerate(u.options):
            lim = K - max(fw, _q(need, q))
            relax(k + 1, k, _q(kept, q) + b[k], lim, float(cost), oi)
        if u.layer is None:
            continue
        for a in _group_starts(problem, k):
            # group a..k: forward needs, kept bytes
            extra = _q(units[a].input_extra, q)
            sig = sum(kept_run[a : k + 1]) + extra
            fw_lim = K
            run = extra
            for m in range(a, k + 1):
                need_m = fw_need[m] + run + (hb[m - 1] if m > a else 0)
                fw_lim = min(fw_lim, K - need_m)
                run += kept_run[m]
            rot = tables.cost(a, k)
            hi = min(fw_lim, K - sig)
            if hi < 0:
                continue
            # H = K - S - extra + P[a] for S = 0..hi
            relax(k + 1, a, sig + b[k], hi, rot, -(a + 1), K - extra + kept_before[a])
    final = best[n]
    lim = K - _q(problem.mid_need, q)
    if lim < 0 or not np.isfinite(final[: lim + 1]).any():
        return None
    S = int(np.argmin(final[: lim + 1]))
    cost = float(final[S])
    choices: list[Choice] = []
    k = n
    while k > 0:
        c = int(code[k][S])
        p = int(prev[k][S])
        if c >= 0:
            choices.append(Choice(k - 1, k - 1, option=c))
            S, k = p, k - 1
        else:
            a = -c - 1
            H = min(max(K - p - _q(units[a].input_extra, q) + int(tables.P[a]), 0), tables.K)
            choices.append(Choice(a, k - 1, events=tables.events(a, k - 1, H, False)))
            S, k = p, a
    choices.reverse()
    return Solution(cost=cost, choices=choices, stored=int(np.argmin(final[: lim + 1])), budget=budget)


def _descending(table: np.ndarray, top: int, hi: int) -> np.ndarray:
    """``table[clip(top - S, 0, len(table) - 1)]`` for ``S = 0..hi``, made of slices (an index array
    and its clipping took longer than the copy, once per group and layer)."""
    last = len(table) - 1
    out = np.empty(hi + 1)
    above = min(max(top - last, 0), hi + 1)  # the first S where top - S is at most ``last``
    end = hi + 1 - min(max(hi - top, 0), hi + 1)  # past the last S where top - S is at least 0
    out[:above] = table[last]
    if above < end:
        out[above:end] = table[top - end + 1 : top - above + 1][::-1]
    out[end:] = table[0]
    return out


def feasible(problem: Problem, budget: int, quantum: int | None = None) -> bool:
    return solve(problem, budget, quantum) is not None


def min_budget(
    problem: Problem, lo: int, hi: int, tolerance: int | None = None, quantum: int | None = None
) -> int | None:
    """The least budget in ``[lo, hi]`` (to ``tolerance`` bytes) the model finds a plan for."""
    found = least_budget(problem, lo, hi, tolerance, quantum)
    return found[0] if found is not None else None


def least_budget(
    problem: Problem, lo: int, hi: int, tolerance: int | None = None, quantum: int | None = None
) -> tuple[int, Solution] | None:
    """:func:`min_budget` and the plan :func:`solve` finds for it (found by the search: not solved again)."""
    best = solve(problem, hi, quantum)
    if best is None:
        return None
    tol = tolerance or max(hi // 512, 4096)
    while hi - lo > tol:
        mid = (lo + hi) // 2
        sol = solve(problem, mid, quantum)
        if sol is not None:
            hi, best = mid, sol
        else:
            lo = mid
    return hi, best


def predict(problem: Problem, sol: Solution) -> dict[str, tuple[int, tuple]]:
    """The model's bytes per slot (``fw:k``, ``bw:k``, ``mid``) for ``sol``, unrounded (what the
    solver checked against the budget), each with the key of the figure that decided it:
    ``("fw", k)``, ``("bw", k, option)`` (option -1: the unit's recompute inside a group),
    ``("adv", k)`` (a group's forward recompute when the backward reaches k) or ``("mid",)``."""
    units = problem.units
    out: dict[str, tuple[int, tuple]] = {}
    S = 0
    for c in sol.choices:
        if c.option is not None:
            k = c.first
            u = units[k]
            _, need, unit_kept = u.options[c.option]
            out[f"fw:{k}"] = (S + u.fw_need, ("fw", k))
            out[f"bw:{k}"] = (S + need, ("bw", k, c.option))
            S += unit_kept + u.boundary
            continue
        a, b = c.first, c.last
        kept = [units[m].layer[2] for m in range(a, b + 1)]  # type: ignore[index]
        S += units[a].input_extra  # the group's input, stored
        sig = sum(kept)
        run = 0
        for m in range(a, b + 1):
            out[f"fw:{m}"] = (S + units[m].fw_need + run + (units[m - 1].held if m > a else 0), ("fw", m))
            run += kept[m - a]
        held: dict[int, int] = {}  # boundary of unit h -> bytes, while alive
        for ev in c.events:
            m = ev.unit
            held = {h: v for h, v in held.items() if h < m}
            before = sum(kept[: m - a])  # the group's units before m keep theirs
            base = S + before + sum(held.values())
            adv = 0
            kept_now = 0  # the advance from ev.start through m - 1 keeps ev.holds on the way
            for i in range(ev.start + 1, m):
                step = units[i].advance + (units[i - 1].held if i > ev.start + 1 else 0)
                adv = max(adv, kept_now + step)
                if i in ev.holds:
                    kept_now += units[i].held
            for h in ev.holds:
                held[h] = units[h].held
            own = _role_need(units[m], m == a, m == b, units[m].layer[1])  # type: ignore[index]
            need = S + before + sum(v for h, v in held.items() if h < m) + own
            event = base + units[m].event_ext + adv if m > ev.start + 1 else -1
            key = ("bw", m, role_key(m, a, b))
            out[f"bw:{m}"] = (event, ("adv", m)) if event > need else (need, key)
        S += sig + units[b].boundary
    out["mid"] = (S + problem.mid_need, ("mid",))
    return out


def solve_milp(problem: Problem, budget: int, quantum: int | None = None, time_limit: float = 60.0) -> Solution | None:
    """The same model as :func:`solve`, as a 0-1 integer programme solved by HiGHS.

    Columns: each unit option on its own, and each group ``a..b`` once per distinct rotor schedule
    (the steps of ``rot(a, b, .)``: a schedule needs headroom ``H`` at least its step's). Rows: every
    unit covered once; per unit the forward and backward constraints and per group its headroom,
    each a sum over the columns of the units before it (the prefix structure stated, not solved for);
    the mid constraint. The same quanta as :func:`solve`, so both find the same least cost.
    """
    from scipy.optimize import Bounds, LinearConstraint, milp

    if problem.outside_need > budget:
        return None
    q, K, tables, b, kept_run = _quantized(problem, budget, quantum)
    cols = _milp_columns(problem, q, tables, b, kept_run)
    m = len(cols)
    rows = _milp_rows(problem, cols, q, K, kept_run, tables.b)
    res = milp(
        c=np.array([c["cost"] for c in cols]),
        constraints=LinearConstraint(rows.matrix(m), np.array(rows.lo), np.array(rows.hi)),
        integrality=np.ones(m),
        bounds=Bounds(0, 1),
        options={"time_limit": time_limit, "mip_rel_gap": 0.0},
    )
    if res.x is None or res.status not in (0, 1):
        return None
    chosen = [cols[j] for j in range(m) if res.x[j] > 0.5]
    choices: list[Choice] = []
    for c in sorted(chosen, key=lambda c: c["a"]):
        if c["opt"] is not None:
            choices.append(Choice(c["a"], c["b"], option=c["opt"]))
        else:
            choices.append(Choice(c["a"], c["b"], events=tables.events(c["a"], c["b"], c["H"], False)))
    return Solution(cost=float(res.fun), choices=choices, stored=sum(c["add"] for c in chosen), budget=budget)


def _milp_columns(problem: Problem, q: int, tables: _Tables, b: list[int], kept_run: list[int]) -> list[dict]:
    """The columns of :func:`solve_milp`: each unit option (``a == b``, ``opt`` its index), then
    each group ``a..b`` once per step of its rotor table (``opt`` None, ``H`` the least headroom
    giving the step's cost). Each has its ``cost`` and the quanta it keeps stored after it (``add``)."""
    units = problem.units
    # columns: (first, last, option | None, cost, stored after, kind data)
    cols: list[dict] = []
    for k, u in enumerate(units):
        for i, (cost, need, kept) in enumerate(u.options):
            cols.append({"a": k, "b": k, "opt": i, "cost": cost, "add": _q(kept, q) + b[k], "need": _q(need, q)})
    for k, u in enumerate(units):
        if u.layer is None:
            continue
        for a in _group_starts(problem, k):
            extra = _q(units[a].input_extra, q)
            sig = sum(kept_run[a : k + 1]) + extra
            rot = tables.cost(a, k)
            finite = np.isfinite(rot)
            if not finite.any():
                continue
            # one column per step of rot: the least H giving each cost
            H = int(np.argmax(finite))
            last = None
            while len(rot) > H:
                step_cost = float(rot[H])
                if last is None or step_cost < last - 1e-15:
                    group = {"a": a, "b": k, "opt": None, "cost": step_cost, "add": sig + b[k], "H": H, "extra": extra}
                    cols.append({**group, "P": int(tables.P[a])})
                    last = step_cost
                nxt = np.nonzero(rot[H:] < step_cost - 1e-15)[0]
                if not len(nxt):
                    break
                H += int(nxt[0])
    return cols


class _MilpRows:
    """The constraint rows of :func:`solve_milp` as they are stated: ``lo <= A x <= hi``, ``A``
    built from ``(row, column, value)`` entries."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.cidx: list[int] = []
        self.vals: list[float] = []
        self.lo: list[float] = []
        self.hi: list[float] = []
        self.count = 0

    def add(self, entries: list[tuple[int, float]], upper: float, lower: float = -np.inf) -> None:
        """One row: ``lower <= sum of value * x[column] over entries <= upper``."""
        for j, v in entries:
            self.rows.append(self.count)
            self.cidx.append(j)
            self.vals.append(v)
        self.lo.append(lower)
        self.hi.append(upper)
        self.count += 1

    def matrix(self, m: int):
        """``A`` over ``m`` columns, in CSR form."""
        from scipy.sparse import coo_matrix

        return coo_matrix((self.vals, (self.rows, self.cidx)), shape=(self.count, m)).tocsr()


def _milp_rows(problem: Problem, cols: list[dict], q: int, K: int, kept_run: list[int], hb: list[int]) -> _MilpRows:
    """The rows of :func:`solve_milp` over ``cols`` (budget ``K`` quanta): per unit covered once,
    its forward and its backward on its own; per group its headroom; the mid constraint."""
    units = problem.units
    rows = _MilpRows()

    def before(k: int) -> list[tuple[int, float]]:
        return [(j, c["add"]) for j, c in enumerate(cols) if c["b"] < k]

    for k in range(len(units)):
        rows.add([(j, 1.0) for j, c in enumerate(cols) if c["a"] <= k <= c["b"]], 1.0, 1.0)  # covered once
        # forward of unit k
        inside = []
        for j, c in enumerate(cols):
            if c["opt"] is None and c["a"] <= k <= c["b"]:
                run = c["extra"] + sum(kept_run[c["a"] : k]) + (hb[k - 1] if k > c["a"] else 0)
                inside.append((j, float(run)))
        rows.add(before(k) + inside, K - _q(units[k].fw_need, q))
        # backward of unit k on its own
        own = [(j, float(c["need"])) for j, c in enumerate(cols) if c["opt"] is not None and c["a"] == k]
        rows.add(before(k) + own, K)
    for j, c in enumerate(cols):  # a group's schedule needs its headroom: S_a <= K - extra + P[a] - H
        if c["opt"] is None:
            need = c["H"] + c["extra"] - c["P"]
            if need > 0:
                rows.add(before(c["a"]) + [(j, float(need))], K)
    rows.add([(j, c["add"]) for j, c in enumerate(cols)], K - _q(problem.mid_need, q))
    return rows


def solution_cost(problem: Problem, sol: Solution) -> float:
    """What ``sol`` costs in the model, counted event by event (the solvers' objective, recounted)."""
    units = problem.units
    total = 0.0
    for c in sol.choices:
        if c.option is not None:
            total += units[c.first].options[c.option][0]
            continue
        for ev in c.events:
            total += sum(units[i].forward_cost for i in range(ev.start + 1, ev.unit))
            total += units[ev.unit].layer[0]  # type: ignore[index]
    return total

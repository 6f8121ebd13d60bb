"""Nest one thread's complete events: self time per operator, the roles they ran in, the steps.

Two implementations of one definition, giving the same figures to the last bit: a loop over the
events with a stack, and a vectorised one (numpy, used when installed: it comes with torch) for
threads of :data:`VECTOR_MIN` events or more. The command line works without numpy.

The definition (the stack's): events are taken by start, the longer first at one start (file
order when the thread is in time order already). An event's *parent* is the nearest earlier event
still open when it starts: ``end > start + 1 ns``, the nanosecond of slack because torch rounds
times to it. Taken stack-free, the parent of event ``i`` is the largest ``j < i`` whose end lies
past ``i``'s start (an event that ended is never open again, since starts only grow), so it is
found for all events at once by bisection over a table of range maxima. What an event is then
follows from its ancestors: a *role* is the outermost range named as a role; a *step* is that of
the nearest step marker above (for a role without one, the marker it lies in); an operator is
*covered* time of its role when no other operator lies between them. Self time is duration less
that of the direct children. Each role range is also returned as a span (start, end, step, name),
for the reader to place other events (a kernel's launch, another thread's operators) in roles.

An operator in no role of its own thread may be *lent* one: the caller gives per event the
(step, role) it takes then (a thread that draws no role of its own, whose work ran during a role
of another thread). Lent roles name operators only: they add nothing to a role's total or covered
time, which stay per thread.

Sums are taken one thread at a time, starting from zero, in the order the loop takes them (a role's
at its start, an operator's when the stack closes it): the loop and :func:`numpy.bincount` add the
same numbers in the same order, so the figures agree exactly; the figures' keys come in one order
(by step, then name) whichever computed them.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Iterable, Sequence
from itertools import islice
from operator import gt
from typing import Any, Final

_np: Any  # numpy, or None where it is not installed
try:
    import numpy

    _np = numpy
except ImportError:  # pragma: no cover - exercised with numpy absent (tests patch it out)
    _np = None

#: Threads with at least this many events are nested by numpy (below, a numpy call costs more than the loop).
VECTOR_MIN: Final = 64
#: What a range's name is, per trace (from ``_trace``): a role, a step marker, an operator.
ROLE, MARK, OP = 1, 2, 3
#: Names of step markers: torch's (``ProfilerStep#N``, drawn by profctx too) and older profctx's ``step N``.
STEP_MARKER: Final = re.compile(r"(?:ProfilerStep#|step )(-?[0-9]+)")

Ops = dict[tuple[int | None, str | None, str], list[Any]]
Roles = dict[tuple[int | None, str], list[Any]]
Marks = Sequence[tuple[float, float, int]]
#: A role range: start, end (microseconds), step (``None``: none), the index of its name.
Span = tuple[float, float, int | None, int]
#: Roles lent to a thread's events: per event (in file order) an index into the table, ``-1`` for none;
#: the table's entries are ``(step, index of the role's name)``.
Lent = tuple[Sequence[int], Sequence[tuple[int | None, int]]]


def step_at(marks: Marks, ts: float) -> int | None:
    """Return the step of the first marker (in file order) that ``ts`` lies in, or ``None``."""
    for start, end, step in marks:
        if start - 1e-3 <= ts < end:
            return step
    return None


def vectorised() -> bool:
    """Return whether numpy is installed (threads of :data:`VECTOR_MIN` events or more are then vectorised)."""
    return _np is not None


def nest(ts: array[float], dur: array[float], name: array[int], kind: bytearray, names: list[str],
         kinds: bytes | bytearray, marks: Marks, marked: bool,
         lent: Lent | None = None) -> tuple[Ops, Roles, list[Span]]:
    """Return one thread's operators ``{(step, role, name): [self, total, count]}``, roles
    ``{(step, name): [total, count, covered]}`` and role ranges (:data:`Span`, by start); times as
    given (microseconds).

    ``ts``, ``dur``, ``name`` (an index into ``names``) and ``kind`` (1: a user range, 0: an
    operator) hold one event each, in file order; ``kinds`` says per name what a range of that name
    is (:data:`ROLE`, :data:`MARK`, :data:`OP`); ``marks`` are the trace's step markers (start, end,
    step) in file order; ``marked``: the trace lists profctx's ranges (a role range inside a role is
    then an operator, else it is left out); ``lent``: the roles lent to operators in no role (see the
    module's docstring). Times that are not finite take the loop.
    """
    if _np is not None and len(ts) >= VECTOR_MIN:
        t = _np.frombuffer(ts, dtype=_np.float64)
        d = _np.frombuffer(dur, dtype=_np.float64)
        if _np.isfinite(t).all() and _np.isfinite(d).all():
            return nest_vectorised(ts, dur, name, kind, names, kinds, marks, marked, lent)
    return nest_loop(ts, dur, name, kind, names, kinds, marks, marked, lent)


def nest_loop(ts: Sequence[float], dur: Sequence[float], name: Sequence[int], kind: Sequence[int],
              names: list[str], kinds: Sequence[int], marks: Marks, marked: bool,
              lent: Lent | None = None) -> tuple[Ops, Roles, list[Span]]:
    """Nest as :func:`nest` does, by a loop over the events with a stack (any times, NaN included)."""
    n = len(ts)
    order: Iterable[int] = range(n)
    if any(map(gt, ts, islice(ts, 1, None))):  # out of time order (pairwise, in C)
        # By start, the longer first at one start: two stable sorts with keys read in C, not a key tuple
        # per event (which took five times the memory of the events' figures).
        order = sorted(sorted(range(n), key=dur.__getitem__, reverse=True), key=ts.__getitem__)
    ops: Ops = {}
    roles: Roles = {}
    spans: list[Span] = []
    codes, lenders = lent if lent is not None else ((), ())
    # Stack entries: [end, index, child time, role key (step, name) or None, step, covered by an operator,
    # is an operator].
    stack: list[list[Any]] = []

    def close(entry: list[Any]) -> None:
        j = entry[1]
        role = entry[3]
        if role is None and codes and codes[j] >= 0:
            lent_step, outer = lenders[codes[j]]
            key = (lent_step, names[outer], names[name[j]])
        else:
            key = (entry[4], None if role is None else role[1], names[name[j]])
        slot = ops.get(key)
        if slot is None:
            ops[key] = [dur[j] - entry[2], dur[j], 1]
        else:
            slot[0] += dur[j] - entry[2]
            slot[1] += dur[j]
            slot[2] += 1

    for i in order:
        start = ts[i]
        length = dur[i]
        # 1 ns of slack: torch rounds times to ns, so a sibling may seem to start inside the previous one.
        limit = start + 1e-3
        while stack and stack[-1][0] <= limit:
            entry = stack.pop()
            if entry[6]:
                close(entry)
        if stack:
            parent = stack[-1]
            parent[2] += length
            role, step, covered = parent[3], parent[4], parent[5]
        else:
            role = step = None
            covered = False
        what = kinds[name[i]] if kind[i] else OP
        if what == ROLE:
            if role is None:
                if step is None:
                    step = step_at(marks, start)
                role = (step, names[name[i]])
                slot = roles.get(role)
                if slot is None:
                    roles[role] = [length, 1, 0.0]
                else:
                    slot[0] += length
                    slot[1] += 1
                spans.append((start, start + length, step, name[i]))
                stack.append([start + length, i, 0.0, role, step, False, False])
                continue
            if not marked:  # a role range inside a role, in a trace that lists none: left out
                stack.append([start + length, i, 0.0, role, step, covered, False])
                continue
            what = OP  # a role range inside a role of a listed trace: an operator of the outer role
        if what == OP:
            if role is not None and not covered:
                roles[role][2] += length
            stack.append([start + length, i, 0.0, role, step, True, True])
        else:  # a step marker
            found = STEP_MARKER.fullmatch(names[name[i]])
            stack.append([start + length, i, 0.0, role, int(found[1]) if found else step, covered, False])
    while stack:
        entry = stack.pop()
        if entry[6]:
            close(entry)
    return _ordered(ops), _ordered(roles), spans


def nest_vectorised(ts: Any, dur: Any, name: Any, kind: Any, names: list[str], kinds: bytes | bytearray,
                    marks: Marks, marked: bool, lent: Lent | None = None) -> tuple[Ops, Roles, list[Span]]:
    """Nest as :func:`nest` does, with numpy (finite times only: a NaN has no place in a sort).

    A thread whose events overlap without nesting is handed to :func:`nest_loop`. Raise ``RuntimeError``
    without numpy.
    """
    np = _np
    if np is None:
        raise RuntimeError("numpy is not installed")
    t = np.asarray(ts, dtype=np.float64)
    d = np.asarray(dur, dtype=np.float64)
    nm = np.asarray(name, dtype=np.int64)
    k = np.asarray(kind, dtype=np.uint8)
    # Positions as int32 where they fit: a thread's arrays are most of the memory a trace takes.
    small = np.int32 if len(t) < (1 << 31) - 1 else np.int64
    n = len(t)
    if n == 0:
        return {}, {}, []
    codes = None if lent is None or not len(lent[1]) else np.asarray(lent[0], dtype=np.int64)
    lenders = () if lent is None else lent[1]
    if (t[:-1] > t[1:]).any():
        order = np.lexsort((-d, t))  # stable: by start, the longer first, then file order
        t, d, nm, k = t[order], d[order], nm[order], k[order]
        if codes is not None:
            codes = codes[order]
    end = t + d
    # The first event whose start (+1 ns) reaches each event's end: from there on it is closed.
    closed = np.searchsorted(t + 1e-3, end, side="left").astype(small)
    np.maximum(closed, np.arange(1, n + 1, dtype=small), out=closed)
    parent = _parents(closed, end)
    del end
    if parent is None:  # events that overlap without nesting: the loop takes the thread
        return nest_loop(ts, dur, name, kind, names, kinds, marks, marked, lent)
    # What each event is. Arrays one longer than the events: index n stands for "none" (no parent).
    up = np.where(parent < 0, small(n), parent).astype(small)
    if k.any():
        what = np.append(np.frombuffer(bytes(kinds), dtype=np.uint8)[nm] * (k != 0), 0)
        named_role = what == ROLE
        outer = _nearest(up, named_role)
        role = named_role.copy()
        role[:n] &= outer[up] == n  # a role: the outermost range named as one
        del outer
        operator = np.append(k == 0, False) | (what == OP)
        if marked:
            operator |= named_role & ~role
        mark = what == MARK
        del what, named_role
        role_of = _nearest(up, role)
        step_from = _nearest(up, mark | role)
        cover_from = _nearest(up, operator | role)
    else:  # operators only: in no role and no step
        role = mark = np.zeros(n + 1, dtype=bool)
        operator = np.append(np.ones(n, dtype=bool), False)
        role_of = step_from = cover_from = np.full(n + 1, n, dtype=small)
    # Steps as indexes into a list (a marker's number may be any integer, None is "no step").
    steps: list[int | None] = [None]
    seen: dict[int | None, int] = {None: 0}
    step_id = np.zeros(n + 1, dtype=small)

    def number(value: int | None) -> int:
        at = seen.get(value)
        if at is None:
            at = seen[value] = len(steps)
            steps.append(value)
        return at

    marked_at = np.flatnonzero(mark)
    if marked_at.size:
        by_name = {int(x): number(_marker(names[int(x)])) for x in np.unique(nm[marked_at])}
        step_id[marked_at] = [by_name[int(x)] for x in nm[marked_at]]
    roles_at = np.flatnonzero(role)
    if roles_at.size:
        above = step_from[up[roles_at]]
        step_id[roles_at] = np.where(above == n, 0, step_id[np.minimum(above, n)])
        for j in roles_at[above == n].tolist():
            step_id[j] = number(step_at(marks, float(t[j])))
    step = step_id[step_from]  # per event: the step of its nearest marker or role (0: none)
    spans: list[Span] = [(start, start + length, steps[at], index) for start, length, at, index in
                         zip(t[roles_at].tolist(), d[roles_at].tolist(), step_id[roles_at].tolist(),
                             nm[roles_at].tolist(), strict=True)]
    # Roles: totals, counts, and the time of the operators directly under them.
    roles: Roles = {}
    ops_at = np.flatnonzero(operator[:n])
    count_names = len(names)
    if roles_at.size:
        group, one = _groups(step[roles_at].astype(np.int64) * count_names + nm[roles_at], len(steps) * count_names)
        count = len(one)
        totals = np.bincount(group, weights=d[roles_at], minlength=count).tolist()
        counts = np.bincount(group, minlength=count).tolist()
        of_role = np.full(n + 1, -1, dtype=np.int64)
        of_role[roles_at] = group
        direct = ops_at[role[cover_from[up[ops_at]]] & (role_of[ops_at] != n)]
        covered = np.bincount(of_role[role_of[direct]], weights=d[direct], minlength=count).tolist()
        for g, j in enumerate(roles_at[one].tolist()):
            roles[(steps[int(step[j])], names[int(nm[j])])] = [totals[g], counts[g], covered[g]]
    # Operators: self time (duration less the direct children's, summed in order), per step, role and name.
    ops: Ops = {}
    if ops_at.size:
        has = parent >= 0
        child = np.bincount(parent[has], weights=d[has], minlength=n)
        # Summed in the order the stack closes them: by the event that closes them, the deeper first.
        ops_at = ops_at[np.argsort(closed[ops_at].astype(np.int64) * (n + 1) + (n - ops_at))]
        # The role an operator ran in, by name, numbered 1.. (0: none); its step (an index into steps).
        role_names = nm[roles_at]
        at = step[ops_at]
        if codes is not None:
            lender_steps = np.array([number(s) for s, _ in lenders], dtype=at.dtype)
            lender_names = np.array([x for _, x in lenders], dtype=np.int64)
            role_names = np.append(role_names, lender_names)
        role_names = np.unique(role_names)
        numbered = np.zeros(count_names + 1, dtype=np.int64)
        numbered[role_names + 1] = np.arange(1, len(role_names) + 1)
        outer = numbered[np.append(nm, -1)[role_of[ops_at]] + 1]
        if codes is not None:
            borrowed = np.flatnonzero((role_of[ops_at] == n) & (codes[ops_at] >= 0))
            code = codes[ops_at[borrowed]]
            outer[borrowed] = numbered[lender_names[code] + 1]
            at = at.copy()
            at[borrowed] = lender_steps[code]
        space = len(steps) * (len(role_names) + 1) * count_names
        if space < 1 << 62:
            group, one = _groups((at.astype(np.int64) * (len(role_names) + 1) + outer) * count_names
                                 + nm[ops_at], space)
        else:  # pragma: no cover - more steps, roles and names than any trace holds
            pair, _ = _groups(at.astype(np.int64) * (len(role_names) + 1) + outer, space)
            group, one = _groups(pair * count_names + nm[ops_at], space)
        count = len(one)
        lengths = d[ops_at]
        selfs = np.bincount(group, weights=lengths - child[ops_at], minlength=count).tolist()
        totals = np.bincount(group, weights=lengths, minlength=count).tolist()
        counts = np.bincount(group, minlength=count).tolist()
        by_number = [None, *(names[x] for x in role_names.tolist())]
        for g, (i, at_step, outer_of) in enumerate(zip(ops_at[one].tolist(), at[one].tolist(), outer[one].tolist(),
                                                       strict=True)):
            ops[(steps[at_step], by_number[outer_of], names[int(nm[i])])] = [selfs[g], totals[g], counts[g]]
    return _ordered(ops), _ordered(roles), spans


def _ordered(table: dict[Any, list[Any]]) -> dict[Any, list[Any]]:
    """Return ``table`` with its keys in one order whatever computed it: by step (none first), then by the
    names (a missing role first)."""
    return dict(sorted(table.items(), key=lambda item: tuple((part is not None, part or 0 if type(part) is not str
                                                                else part) for part in item[0])))


def _marker(text: str) -> int | None:
    found = STEP_MARKER.fullmatch(text)
    return int(found[1]) if found else None


def _parents(closed: Any, end: Any) -> Any:
    """Return each event's parent (``-1``: none), the largest ``j < i`` with ``closed[j] > i``, or ``None``
    when some event ends after its parent (see below). ``closed[j] > j`` for every ``j``.

    An event's depth is how many earlier events are open at its start: ``i`` less the events closed by
    then, counted with one :func:`numpy.bincount`. While every event ends within its parent, the open
    events form one chain and the parent is the last earlier event one level up, found for all events
    by one bisection over the events sorted by depth. That condition is checked on the parents found
    (by induction it makes each of them exact); when it fails the caller takes the loop.
    """
    np = _np
    assert np is not None
    n = len(closed)
    shut = np.cumsum(np.bincount(closed, minlength=n + 1))[:n]  # events closed by each position
    depth = (np.arange(n, dtype=closed.dtype) - shut).astype(closed.dtype)
    del shut
    nested = np.flatnonzero(depth)
    parent = np.full(n, -1, dtype=closed.dtype)
    if not nested.size:
        return parent
    by_depth = np.argsort(depth, kind="stable")
    ranked = depth[by_depth].astype(np.int64) * n + by_depth  # ascending: by depth, then by position
    found = by_depth[np.searchsorted(ranked, (depth[nested].astype(np.int64) - 1) * n + nested) - 1]
    del ranked, by_depth
    if not ((closed[found] > nested).all() and (depth[found] == depth[nested] - 1).all()
            and (end[nested] <= end[found]).all()):
        return None
    parent[nested] = found
    return parent


def _nearest(up: Any, chosen: Any) -> Any:
    """Return per event the nearest of itself and its ancestors that is ``chosen``, ``n`` for none.

    ``up``: each event's parent (``n``: none); ``chosen``: ``n + 1`` flags, the last false. By
    pointer jumping: each pass doubles how far a pointer has gone, so ``log2`` of the depth passes.
    """
    np = _np
    assert np is not None
    n = len(up)
    at = np.empty(n + 1, dtype=up.dtype)
    at[:n] = np.where(chosen[:n], np.arange(n, dtype=up.dtype), up)
    at[n] = n
    while True:
        ahead = at[at]
        if np.array_equal(ahead, at):
            return at
        at = ahead


def _groups(key: Any, space: int) -> tuple[Any, Any]:
    """Return, for non-negative integer keys below ``space``, each one's group (numbered in key order) and
    one position in each group."""
    np = _np
    assert np is not None
    if space <= max(4 * len(key), 1 << 16):  # a small space: counted directly, no sort
        present = np.flatnonzero(np.bincount(key, minlength=space))
        number = np.zeros(space, dtype=np.int64)
        number[present] = np.arange(len(present))
        group = number[key]
        one = np.zeros(len(present), dtype=np.int64)
        one[group] = np.arange(len(key))
        return group, one
    _, one, group = np.unique(key, return_index=True, return_inverse=True)
    return group.reshape(-1), one

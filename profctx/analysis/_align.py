"""Line the processes of a job up on one clock, step by step: work, wait and arrival lag, and the straggler.

Pure functions over plain values; the readers (:mod:`profctx.analysis._timeline` for the step
timelines, :mod:`profctx.analysis._summary` for traces) build the :class:`Lane` of each process in
each step. The definitions (also in ``docs/analysis.md``):

- A step of a process is cut into **segments**: *before the step* (from its previous step's exit to
  this step's entry: the data loader, logging), each top-level role the processes share (its first
  entry to its last exit), and *(outside roles)* between them. A segment's time on a process is read on
  that process's own clock: exact whatever the hosts.
- **Wait** is the part of a segment a process spent waiting for the others. From a trace: inside a gloo
  collective matched across processes (same name, same position among the step's collectives of that
  name), the time from its own arrival to the last arrival (the rest is the *transfer*). From the timeline
  (no trace): in a segment that synchronises the processes (:func:`sync_points`) and that they leave
  together in the step (their exits within :attr:`Rules.together_s`, or a quarter of how far apart
  they entered), the time from its own entry to the last other process's.
  **Work** is the rest.
- **Arrival lag** of a process at a segment is how much later it entered it than the first process did,
  on the aligned clock.
- The **lag accrued** by a process in a segment is its work there less the median of the other
  processes' work there; its **ratio** is its work over that median (over the *other* processes: with two,
  the other one).
- The **straggler** of a step is the process with the largest lag accrued, when it is at least
  :attr:`Rules.min_s` and :attr:`Rules.share` of the step and its ratio exceeds :attr:`Rules.ratio`,
  named with the segment where it accrued and the others' waits after it.
- **Clocks.** Processes of one host share its clock. Across hosts, each host's offset from the first host
  is the median of the differences of events the processes end together (matched collectives' ends,
  else step exits), with an uncertainty (three scaled median absolute deviations, at least
  :data:`MIN_UNCERTAINTY_S`). Waits and lags are only as good as it: a straggler whose lag is not beyond
  twice the uncertainty is not named, and the answer says why.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

#: The segment of the time between a process's previous step and this one.
BEFORE: Final = "before the step"
#: The segments of a step in no shared role.
OUTSIDE: Final = "(outside roles)"
#: The uncertainty of a clock offset estimated across hosts, at least (seconds).
MIN_UNCERTAINTY_S: Final = 0.0005


@dataclass(frozen=True)
class Collective:
    """A collective as one process's trace records it: name, start and end (its own clock, seconds), its role."""

    name: str
    start: float
    end: float
    role: str | None = None


@dataclass(frozen=True)
class Lane:
    """One process in one step, on its own wall clock (Unix seconds).

    ``before``: its previous step's exit (``None``: unknown); ``roles``: each top-level role's first entry
    and last exit; ``collectives``: from its trace of the step, in time order (empty without one).
    """

    process: str
    host: str
    start: float
    end: float
    before: float | None = None
    roles: tuple[tuple[str, float, float], ...] = ()
    collectives: tuple[Collective, ...] = ()


@dataclass(frozen=True)
class Clocks:
    """Per process, what to add to its times to read them on the reference clock, and how unsure that is."""

    offsets: Mapping[str, float]
    uncertainty: Mapping[str, float]
    reference: str | None = None
    #: How the offsets were estimated ("one host", "collectives", "step exits", "none in common").
    source: str = "one host"

    def to_json(self) -> dict[str, Any]:
        """Return the clocks as JSON-safe values (an unknown uncertainty is ``None``)."""
        return {"reference_host": self.reference, "source": self.source,
                "offsets_s": dict(self.offsets),
                "uncertainty_s": {k: (v if math.isfinite(v) else None) for k, v in self.uncertainty.items()}}


@dataclass(frozen=True)
class Rules:
    """What it takes to name a straggler (see the module's docstring)."""

    ratio: float = 1.2
    #: A loaded 2-core machine shifts a process's segments by a few ms (measured: up to 7.5 ms in 55 ms steps):
    #: a lag under 10 ms, or under a tenth of the step, is noise more often than a straggler.
    min_s: float = 0.010
    share: float = 0.10
    together_s: float = 0.005

    def to_json(self) -> dict[str, Any]:
        """Return the rules as stated in the JSON documents."""
        return {"ratio": self.ratio, "min_s": self.min_s, "share": self.share, "together_s": self.together_s,
                "rule": "the process with the largest lag accrued in a segment (its work there less the median of "
                        "the other processes' work), at least min_s and share of the step, work over the others' "
                        "median above ratio; waiting is not work"}


@dataclass
class Segment:
    """One segment of one process in a step: its time, the wait in it, its arrival lag."""

    name: str
    time_s: float
    wait_s: float
    lag_s: float | None
    #: The collective the wait was in (the one that waited longest), when a trace says.
    collective: str | None = None
    #: Time in the segment's collectives after the last process arrived (the transfer); ``None``: no trace says.
    transfer_s: float | None = None

    @property
    def work_s(self) -> float:
        """Time less wait."""
        return self.time_s - self.wait_s

    def to_json(self) -> dict[str, Any]:
        """Return the JSON form."""
        return {"segment": self.name, "time_s": self.time_s, "work_s": self.work_s, "wait_s": self.wait_s,
                "arrival_lag_s": self.lag_s, "collective": self.collective, "transfer_s": self.transfer_s}


@dataclass
class Wait:
    """How long one other process waited for the straggler, and where."""

    process: str
    wait_s: float
    segment: str
    collective: str | None = None

    def to_json(self) -> dict[str, Any]:
        """Return the JSON form."""
        return {"process": self.process, "wait_s": self.wait_s, "segment": self.segment,
                "collective": self.collective}


@dataclass
class Straggler:
    """The process the others waited for in a step, the segment where its lag accrued, and by how much."""

    process: str
    segment: str
    lag_s: float
    work_s: float
    others_s: float
    waited: list[Wait] = field(default_factory=list)

    @property
    def ratio(self) -> float | None:
        """Work over the median of the other processes' work in the segment (``None`` when theirs is 0)."""
        return self.work_s / self.others_s if self.others_s > 0 else None

    def to_json(self) -> dict[str, Any]:
        """Return the JSON form."""
        return {"process": self.process, "segment": self.segment, "lag_s": self.lag_s, "work_s": self.work_s,
                "others_s": self.others_s, "ratio": self.ratio, "waited": [w.to_json() for w in self.waited]}


@dataclass
class StepAlignment:
    """One step across processes: each one's segments, the straggler (or why none is named)."""

    step: int
    processes: dict[str, list[Segment]]
    straggler: Straggler | None = None
    #: Why no straggler is named, or what limits the answer (``None``: nothing to say).
    note: str | None = None
    #: The wait came from the traces' collectives (else inferred from the timeline's entries and exits).
    from_collectives: bool = False
    #: The segments the processes left together in this step (their exits close; see :func:`sync_points`).
    together: set[str] = field(default_factory=set)
    #: ``{segment: (entry spread, exit spread)}``: how far apart the processes entered and left it (seconds).
    spreads: dict[str, tuple[float, float]] = field(default_factory=dict)

    def wait(self, process: str, segment: str) -> float:
        """Return the seconds ``process`` waited in ``segment`` (0 when absent)."""
        return sum(s.wait_s for s in self.processes.get(process, []) if s.name == segment)

    def to_json(self) -> dict[str, Any]:
        """Return the JSON form."""
        return {"step": self.step, "straggler": None if self.straggler is None else self.straggler.to_json(),
                "note": self.note, "wait_from": "collectives" if self.from_collectives else "timeline",
                "processes": {p: [s.to_json() for s in segs] for p, segs in self.processes.items()}}


def answer(found: StepAlignment, label: str = "") -> str:
    """Return the straggler of ``found`` as one line a user reads (or why there is none)."""
    s = found.straggler
    if s is None:
        return found.note or "no straggler"
    who = label or s.process
    if s.segment == BEFORE:
        head = f"{who} entered step {found.step} {_ms(s.lag_s)} late: the time before the step"
    else:
        head = f"{who}: +{_ms(s.lag_s)} in `{s.segment}`"
        if s.ratio is not None:
            head += f" ({s.ratio:.1f}x the others)"
    if s.waited:
        waits = "; ".join(
            f"{w.process} waited {_ms(w.wait_s)} in `{w.segment}`" + (f"'s {w.collective}" if w.collective else "")
            for w in s.waited[:3])
        if len(s.waited) > 3:
            waits += f"; +{len(s.waited) - 3} more"
        head += f"; {waits}"
    else:
        head += "; no process waited for it in this step"
    if found.note:
        head += f" ({found.note})"
    return head


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms" if abs(seconds) >= 0.0095 else f"{seconds * 1e3:.1f} ms"


# -- clocks ----------------------------------------------------------------------------------------


def clocks(steps: Mapping[int, Sequence[Lane]]) -> Clocks:
    """Return each process's clock offset from the first host's (that of the first lane given), from what the
    processes end together."""
    hosts: dict[str, str] = {}
    for lanes in steps.values():
        for lane in lanes:
            hosts.setdefault(lane.process, lane.host)
    names = list(dict.fromkeys(hosts.values()))
    if len(names) <= 1:
        return Clocks(dict.fromkeys(hosts, 0.0), dict.fromkeys(hosts, 0.0), names[0] if names else None)
    reference = names[0]
    by_host: dict[str, tuple[float, float]] = {reference: (0.0, 0.0)}
    source = "step exits"
    for host in names[1:]:
        samples: list[float] = []
        for lanes in steps.values():
            ours = [lane for lane in lanes if lane.host == reference]
            theirs = [lane for lane in lanes if lane.host == host]
            if not ours or not theirs:
                continue
            ends = _collective_ends(ours, theirs)
            if ends:
                source = "collectives"
                samples.extend(ends)
            else:
                samples.append(statistics.median(lane.end for lane in ours)
                               - statistics.median(lane.end for lane in theirs))
        if not samples:
            by_host[host] = (0.0, math.inf)
            source = "none in common"
            continue
        offset = statistics.median(samples)
        spread = statistics.median(abs(x - offset) for x in samples) * 1.4826 * 3
        by_host[host] = (offset, max(spread, MIN_UNCERTAINTY_S))
    return Clocks({p: by_host[h][0] for p, h in hosts.items()}, {p: by_host[h][1] for p, h in hosts.items()},
                  reference, source)


def _collective_ends(ours: Sequence[Lane], theirs: Sequence[Lane]) -> list[float]:
    """Return, per collective matched between one process of each host, the difference of their ends."""
    a, b = ours[0], theirs[0]
    left, right = _by_name(a.collectives), _by_name(b.collectives)
    return [x.end - y.end for name, xs in left.items() for x, y in zip(xs, right.get(name, ()), strict=False)]


def _by_name(found: Sequence[Collective]) -> dict[str, list[Collective]]:
    out: dict[str, list[Collective]] = {}
    for c in found:
        out.setdefault(c.name, []).append(c)
    return out


# -- one step --------------------------------------------------------------------------------------


def align_steps(steps: Mapping[int, Sequence[Lane]], clock: Clocks | None = None, rules: Rules = Rules(),
                sync: frozenset[str] | None = None) -> dict[int, StepAlignment]:
    """Return the alignment of every step of ``steps``, in step order.

    A wait is inferred from the timeline (no collective in a trace) only in a segment that synchronises the
    processes (:func:`sync_points`: entered far apart, they leave it together, as DDP's backward makes
    them), not where they happen to leave together once; ``sync`` gives those segments (else they are
    found here).
    """
    clock = clocks(steps) if clock is None else clock
    if sync is None:
        sync = sync_points(steps, clock, rules)
    return {step: align(step, lanes, clock, rules, sync) for step, lanes in sorted(steps.items())}


#: A segment is a synchronisation point when the processes, having entered it at least :data:`EVIDENCE_S`
#: apart, leave it within a quarter of that in this share of such steps ...
SYNC_SHARE: Final = 0.8
#: ... judged over at least this many steps of the run (fewer: each step is judged alone).
SYNC_STEPS: Final = 3
#: Entries this far apart tell whether a segment synchronises; closer ones (noise) tell nothing.
EVIDENCE_S: Final = 0.02


def sync_points(steps: Mapping[int, Sequence[Lane]], clock: Clocks, rules: Rules = Rules()) -> frozenset[str] | None:
    """Return the segments that synchronise the processes (``None``: too few steps to tell).

    Only steps where the processes entered a segment far apart (:data:`EVIDENCE_S`) say anything: in a
    synchronising segment they then leave it together, elsewhere as far apart as they came in.
    """
    if len(steps) < SYNC_STEPS:
        return None
    telling: dict[str, int] = {}
    together: dict[str, int] = {}
    for step, lanes in steps.items():
        found = align(step, lanes, clock, rules)
        for name, (entered, left) in found.spreads.items():
            if entered < EVIDENCE_S:
                continue
            telling[name] = telling.get(name, 0) + 1
            if left <= entered / 4:
                together[name] = together.get(name, 0) + 1
    return frozenset(n for n, count in telling.items() if together.get(n, 0) >= SYNC_SHARE * count)


def align(step: int, lanes: Sequence[Lane], clock: Clocks | None = None, rules: Rules = Rules(),
          sync: frozenset[str] | None = None) -> StepAlignment:
    """Return the alignment of the processes ``lanes`` in ``step`` (one lane per process).

    Processes that run different roles (a Ray driver and its workers, two worker groups) are lined up
    with those that run the same ones: each set of two or more processes with the same roles apart, the
    straggler being the one with the largest lag of them all. ``sync``: the segments where a wait may be
    inferred from entries and exits (see :func:`align_steps`; ``None``: wherever the processes leave together).
    """
    if clock is None:
        clock = clocks({step: lanes})
    groups: dict[frozenset[str], list[Lane]] = {}
    for lane in lanes:
        groups.setdefault(frozenset(n for n, _, _ in lane.roles), []).append(lane)
    together = [g for g in groups.values() if len(g) >= 2]
    if len(groups) > 1 and together:
        parts = [_align_one(step, g, clock, rules, sync) for g in together]
        merged = StepAlignment(step, {p: segs for part in parts for p, segs in part.processes.items()})
        merged.together = set().union(*(part.together for part in parts))
        merged.spreads = {k: v for part in parts for k, v in part.spreads.items()}
        named = [part for part in parts if part.straggler is not None]
        best = max(named, key=lambda part: part.straggler.lag_s if part.straggler else 0.0) if named else parts[0]
        merged.straggler, merged.note, merged.from_collectives = best.straggler, best.note, best.from_collectives
        apart = [lane.process for g in groups.values() if len(g) == 1 for lane in g]
        if apart:
            extra = f"{', '.join(apart[:4])}{' …' if len(apart) > 4 else ''} ran other roles: not compared"
            merged.note = f"{merged.note}; {extra}" if merged.note else extra
        return merged
    return _align_one(step, lanes, clock, rules, sync)


def _align_one(step: int, lanes: Sequence[Lane], clock: Clocks, rules: Rules,
               sync: frozenset[str] | None = None) -> StepAlignment:
    """Return the alignment of ``lanes`` over the roles they all run."""
    if len(lanes) < 2:
        segs = {lane.process: [Segment(n, b - a, 0.0, 0.0) for n, a, b in _cuts(lane, _shared(lanes))]
                for lane in lanes}
        return StepAlignment(step, segs, note="one process: no other to compare it with")
    shared = _shared(lanes)
    cuts = {lane.process: _cuts(lane, shared) for lane in lanes}
    if len({tuple(n for n, _, _ in c) for c in cuts.values()}) > 1:  # some process lacks a previous step
        cuts = {p: [c for c in found if c[0] != BEFORE] for p, found in cuts.items()}
    offset = {lane.process: clock.offsets.get(lane.process, 0.0) for lane in lanes}
    unsure = max((clock.uncertainty.get(lane.process, 0.0) for lane in lanes), default=0.0)
    names = [n for n, _, _ in next(iter(cuts.values()))]
    processes: dict[str, list[Segment]] = {p: [] for p in cuts}
    left: set[str] = set()
    spreads: dict[str, tuple[float, float]] = {}
    for at, name in enumerate(names):
        entry = {p: c[at][1] + offset[p] for p, c in cuts.items()}
        exit_ = {p: c[at][2] + offset[p] for p, c in cuts.items()}
        first = min(entry.values())
        spread_in = max(entry.values()) - first
        spread_out = max(exit_.values()) - min(exit_.values())
        spreads[name] = (spread_in, spread_out)
        together = spread_out <= max(rules.together_s + 2 * unsure, spread_in / 4)
        if together:
            left.add(name)
        together = together and (sync is None or name in sync)
        latest_other = _others_max(entry) if together else {}
        for p, c in cuts.items():
            time_s = c[at][2] - c[at][1]
            wait = 0.0
            if together and math.isfinite(unsure):
                latest = latest_other[p]
                wait = min(max(latest - entry[p], 0.0), time_s)
            processes[p].append(Segment(name, time_s, wait, entry[p] - first if math.isfinite(unsure) else None))
    from_collectives = _collective_waits(lanes, processes, offset, unsure)
    found = StepAlignment(step, processes, from_collectives=from_collectives)
    found.together = left
    found.spreads = spreads
    _name_straggler(found, names, lanes, unsure, rules)
    return found


def _shared(lanes: Sequence[Lane]) -> list[str]:
    """Return the top-level roles every lane has, in the order the processes entered them (median)."""
    common = set.intersection(*({n for n, _, _ in lane.roles} for lane in lanes)) if lanes else set()
    entry: dict[str, list[float]] = {}
    for lane in lanes:
        for n, a, _ in lane.roles:
            if n in common:
                entry.setdefault(n, []).append(a - lane.start)
    return sorted(common, key=lambda n: (statistics.median(entry[n]), n))


def _cuts(lane: Lane, shared: Sequence[str]) -> list[tuple[str, float, float]]:
    """Return the segments of ``lane`` in order: ``(name, entry, exit)``, own clock; roles that overlap on this
    process (repeated, interleaved) leave only the whole step."""
    out: list[tuple[str, float, float]] = []
    if lane.before is not None and lane.before <= lane.start:
        out.append((BEFORE, lane.before, lane.start))
    spans = {n: (a, b) for n, a, b in lane.roles}
    at = lane.start
    inner: list[tuple[str, float, float]] = []
    for name in shared:
        a, b = spans[name]
        if a < at - 1e-6 or b < a:
            inner = [("step", lane.start, lane.end)]
            break
        if a - at > 0:
            inner.append((OUTSIDE, at, a))
        inner.append((name, a, b))
        at = b
    else:
        if lane.end > at:
            inner.append((OUTSIDE, at, lane.end))
    if not shared:
        inner = [("step", lane.start, lane.end)]
    # Gaps between roles are one segment per gap; keep their names unique per position.
    seen: dict[str, int] = {}
    for name, a, b in inner:
        if name == OUTSIDE:
            seen[name] = seen.get(name, 0) + 1
            name = OUTSIDE if seen[name] == 1 else f"{OUTSIDE} {seen[name]}"
        out.append((name, a, b))
    return out


def _collective_waits(lanes: Sequence[Lane], processes: dict[str, list[Segment]], offset: Mapping[str, float],
                      unsure: float) -> bool:
    """Replace the inferred waits by those of the collectives matched across ``lanes``; return whether any."""
    if not all(lane.collectives for lane in lanes) or not math.isfinite(unsure):
        return False
    named = {lane.process: _by_name(lane.collectives) for lane in lanes}
    common = set.intersection(*(set(v) for v in named.values()))
    waits: dict[str, dict[str, list[Any]]] = {lane.process: {} for lane in lanes}
    bounds = {lane.process: lane for lane in lanes}
    for name in common:
        count = min(len(v[name]) for v in named.values())
        for k in range(count):
            arrivals = {p: v[name][k].start + offset[p] for p, v in named.items()}
            last = max(arrivals.values())
            for p, v in named.items():
                c = v[name][k]
                wait = min(max(last - arrivals[p], 0.0), c.end - c.start)
                where = c.role if c.role is not None else _segment_at(bounds[p], processes[p], c.start)
                slot = waits[p].setdefault(where, [0.0, name, 0.0, 0.0])
                slot[0] += wait
                slot[3] += (c.end - c.start) - wait
                if wait >= slot[2]:
                    slot[1], slot[2] = name, wait
    if not any(waits.values()):
        return False
    for p, segs in processes.items():
        for seg in segs:
            got = waits[p].get(seg.name)
            seg.wait_s = min(got[0], seg.time_s) if got else 0.0
            seg.collective = got[1] if got and got[0] > 0 else None
            seg.transfer_s = got[3] if got else 0.0
    return True


def _segment_at(lane: Lane, segs: Sequence[Segment], when: float) -> str:
    """Return the name of the segment of ``lane`` that holds ``when`` (own clock)."""
    at = lane.start
    for seg in segs:
        if seg.name == BEFORE:
            continue
        if when < at + seg.time_s:
            return seg.name
        at += seg.time_s
    return segs[-1].name if segs else "step"


def _others_max(values: Mapping[str, float]) -> dict[str, float]:
    """Return per key the largest of the other keys' values (two or more keys)."""
    ranked = sorted(values, key=values.__getitem__, reverse=True)
    top, second = values[ranked[0]], values[ranked[1]]
    return {k: second if k == ranked[0] else top for k in values}


def _others_median(values: Mapping[str, float]) -> dict[str, float]:
    """Return per key the median of the other keys' values (two or more keys), in one sort."""
    ranked = sorted(values, key=values.__getitem__)
    ordered = [values[k] for k in ranked]
    n = len(ordered) - 1  # the others' count
    out: dict[str, float] = {}
    for at, key in enumerate(ranked):
        def nth(i: int, at: int = at) -> float:  # the i-th of the others, in order
            return ordered[i if i < at else i + 1]
        out[key] = nth(n // 2) if n % 2 else (nth(n // 2 - 1) + nth(n // 2)) / 2
    return out


def _name_straggler(found: StepAlignment, names: Sequence[str], lanes: Sequence[Lane], unsure: float,
                    rules: Rules) -> None:
    step_s = statistics.median(lane.end - lane.start for lane in lanes)
    best: tuple[float, str, int, float, float] | None = None
    for at in range(len(names)):
        work = {p: segs[at].work_s for p, segs in found.processes.items()}
        medians = _others_median(work)
        for p, mine in work.items():
            others = medians[p]
            lag = mine - others
            if lag < max(rules.min_s, rules.share * step_s) or (others > 0 and mine / others <= rules.ratio):
                continue
            if best is None or lag > best[0]:
                best = (lag, p, at, mine, others)
    if best is None:
        if not math.isfinite(unsure):
            found.note = "the hosts' clocks share no event to compare them by: who waited cannot be told"
        else:
            found.note = "no process made the others wait"
        return
    lag, p, at, mine, others = best
    if not math.isfinite(unsure) or lag <= 2 * unsure:
        found.note = (f"{p} took {_ms(lag)} longer in `{names[at]}`, within the clocks' uncertainty "
                      f"(±{_ms(unsure) if math.isfinite(unsure) else 'unknown'}): who waited cannot be told")
        return
    waited = []
    for q, segs in found.processes.items():
        if q == p:
            continue
        later = [s for s in segs[at:] if s.wait_s > 0]
        total = sum(s.wait_s for s in later)
        if later and total >= rules.min_s / 2:
            worst = max(later, key=lambda s: s.wait_s)
            waited.append(Wait(q, total, worst.name, worst.collective))
    waited.sort(key=lambda w: -w.wait_s)
    found.straggler = Straggler(p, names[at], lag, mine, others, waited)
    if unsure > 0:
        found.note = f"clocks across hosts aligned within ±{_ms(unsure)}"

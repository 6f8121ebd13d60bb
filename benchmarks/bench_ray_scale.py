"""Worker groups at scale: a real 64-actor run in three groups, and a simulated group of up to 1,024 members.

``--only real``: a local Ray cluster (2 CPUs, no dashboard), ``--workers`` actors of
``_ray_actors.Probe`` (``num_cpus=0``) in three groups (``actor``: half of them, ``critic`` and
``rollout``: a quarter each), ``--selected`` of them profiled (``groups={...: {"ranks": [...]}}``,
default 8 + 5 + 5 = 18), step mode, backend ``--tool`` (``noop`` by default: 64 actors with torch
do not fit beside other work on this machine). A step is N phases (``--calls``, default a run with
N = 1 and one with N = 3: rollout, log-probs, update), each ``ray.get([a.work.remote(ms) ...])`` on
every actor: each sleeps ``--work-ms`` (a device computing; the host's CPU stays free). In each
of ``--rounds`` rounds, ``--steps`` steps of each kind, in this order: the same loop with profctx
not configured (the baseline), out-of-window steps, in-window steps; ratios are each round's
median step time over its baseline's, then the median of the rounds. Registration: ``group()``
of the three groups on fresh actors, until every member has joined (``group()`` returns with the
joins sent; reading ``members`` waits for them), against Ray's own cost of one no-op
``__ray_call__`` to every actor (the same actors, just before). Afterwards, the manifest must
hold exactly one capture per selected member per in-window step.

``--only ride``: pure Ray, no profctx: the same step with control for the selected actors sent as
separate calls, riding as an argument of the step's own call (entry only, or entry and leave), the
floor of each design (:func:`bench_ride`).

``--only sim``: no Ray cluster. Stand-in handles answer profctx's control calls like actors
(each answer ready after ``--latency-ms`` ± 50 %, in parallel, as actors are); ``ray.wait`` and
``ray.get`` are replaced, in ``profctx.ray`` only, by their stand-in twins. One group of N
members, S of them selected. Per step: the driver's CPU time (``thread_time``) and wall time of
an in-window and an out-of-window step, registration time, and the driver's memory per member
(``tracemalloc``: what ``group()`` allocates, and the growth over 100 in-window steps). Then the
same with faults: a share of members frozen (never answer: lost after ``control_timeout``) or
dead (every call fails: re-joined once per in-window step). Slopes are least-squares fits.

Run: ``PYTHONPATH=. python benchmarks/bench_ray_scale.py [--only real,sim] [--workers 64]``.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import random
import statistics
import sys
import tempfile
import time
import tracemalloc
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ray

import profctx
import profctx.ray
from profctx.records._manifest import read

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _ray_actors import Probe, nothing  # noqa: E402 - the folder is on sys.path only from here

# -- the ride prototype: pure Ray, what control riding the step's own call would cost --------------------


def bench_ride(workers: int, selected: int, rounds: int, steps: int, work_ms: float) -> None:
    """Time one step of one ``work`` call to every actor, control for ``selected`` of them sent four ways.

    ``separate``: two ``__ray_call__`` control calls per selected actor (enter before the step's
    calls, leave after; never waited for, their replies checked at the next step, as profctx does
    for sync members); ``enter rides``: the step's own call to a selected actor carries the entry
    as an argument, the leave is a separate call; ``both ride``: the entry rides and the leave
    rides on the next step's call (nothing separate). Pure Ray, no profctx: the floor of each design.
    """
    actors = [Probe.remote() for _ in range(workers)]  # type: ignore[attr-defined]
    ray.get([a.plain.remote() for a in actors])
    chosen = actors[:selected]
    rest = actors[selected:]
    pending: list[Any] = []

    def step(kind: str, number: int) -> None:
        nonlocal pending
        if pending:
            ray.wait(pending, num_returns=len(pending), timeout=0)  # checked, never waited for
        if kind == "separate":
            pending = [a.__ray_call__.remote(nothing) for a in chosen]
        if kind == "plain":
            ray.get([a.work.remote(work_ms) for a in actors])
        else:
            control = None if kind == "separate" else (number, time.time(), 60.0)
            ray.get([*(a.work_riding.remote(work_ms, control) for a in chosen),
                     *(a.work.remote(work_ms) for a in rest)])
        if kind in ("separate", "enter rides"):
            pending = [*pending, *(a.__ray_call__.remote(nothing) for a in chosen)]

    kinds = ("plain", "separate", "enter rides", "both ride")
    wall: dict[str, list[float]] = {k: [] for k in kinds}
    cpu: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(rounds):
        for kind in kinds:
            step(kind, 0)  # warm
            ws, cs = [], []
            for n in range(steps):
                c0, t0 = time.process_time(), time.perf_counter()
                step(kind, n)
                ws.append(time.perf_counter() - t0)
                cs.append(time.process_time() - c0)
            wall[kind].append(statistics.median(ws) * 1e3)
            cpu[kind].append(statistics.median(cs) * 1e3)
    for a in actors:
        ray.kill(a)
    base_w, base_c = statistics.median(wall["plain"]), statistics.median(cpu["plain"])
    print(f"\n## ride prototype: {workers} actors, {selected} get control, one work({work_ms:g} ms) call to each "
          f"per step; median of {rounds} rounds of {steps} steps")
    print("| control | step (ms) | x plain | driver CPU per step (ms) | CPU added per selected actor (ms) |")
    print("|---|---:|---:|---:|---:|")
    for kind in kinds:
        w, c = statistics.median(wall[kind]), statistics.median(cpu[kind])
        print(f"| {kind} | {w:.1f} | {w / base_w:.3f} | {c:.2f} | {(c - base_c) / selected:.3f} |")


# -- the real run -----------------------------------------------------------------------------------


def _split(n: int) -> dict[str, int]:
    return {"actor": n // 2, "critic": n // 4, "rollout": n - n // 2 - n // 4}


def _step(actors: Sequence[Any], ms: float, calls: int) -> None:
    for _ in range(calls):  # one phase after another (rollout, log-probs, update), each on every actor
        ray.get([a.work.remote(ms) for a in actors])


#: The driver's CPU time (ms, every thread of the process: Ray's own threads send the calls) of each step timed.
CPU: dict[str, list[float]] = {}


def _steps(actors: Sequence[Any], steps: Sequence[int] | None, count: int, ms: float, calls: int,
           kind: str = "") -> float:
    """Return the median wall time (ms) of ``count`` steps (``steps``: their numbers, or no step block)."""
    times = []
    for i in range(count):
        c0 = time.process_time()
        t0 = time.perf_counter()
        if steps is None:
            _step(actors, ms, calls)
        else:
            with profctx.profile_step(steps[i]):
                _step(actors, ms, calls)
        times.append((time.perf_counter() - t0) * 1e3)
        CPU.setdefault(f"{kind}:{calls}", []).append((time.process_time() - c0) * 1e3)
    return statistics.median(times)


def bench_real(save: str, workers: int, selected: Sequence[int], tool: str, rounds: int, steps: int,
               work_ms: float, calls: Sequence[int]) -> None:
    sizes = _split(workers)
    chosen = dict(zip(sizes, selected, strict=True))
    # A window as long as the in-window steps run: a window is held as its steps (100,000 steps cost
    # each process tens of milliseconds to check and hold at configure).
    config = {"steps": f"1:{len(calls) * rounds * steps + 1}", "mode": "step", "tool": tool, "save_path": save,
              "run_id": "scale", "warmup": False,
              "groups": {name: {"ranks": list(range(k))} for name, k in chosen.items()}}
    t0 = time.perf_counter()
    actors = [Probe.remote() for _ in range(workers)]  # type: ignore[attr-defined]
    ray.get([a.plain.remote() for a in actors])
    started = time.perf_counter() - t0
    ray.get([a.__ray_call__.remote(nothing) for a in actors])
    t0 = time.perf_counter()
    ray.get([a.__ray_call__.remote(nothing) for a in actors])
    ray_round = time.perf_counter() - t0
    groups: dict[str, list[Any]] = {}
    it = iter(actors)
    for name, size in sizes.items():
        groups[name] = list(itertools.islice(it, size))

    def register() -> tuple[float, float]:
        """Return the seconds the three ``group()`` calls took, and until every member had joined."""
        profctx.configure(config)
        t0 = time.perf_counter()
        made = [profctx.ray.group(name, members) for name, members in groups.items()]
        sent = time.perf_counter() - t0
        joined = [m.pid for grp in made for m in grp.members]  # reading members waits for the joins
        assert None not in joined, "a member did not join"
        return sent, time.perf_counter() - t0

    registered_sent, registered = register()
    profctx.reset()
    in_window = itertools.count(1)
    out_window = itertools.count(10**6)
    captured_steps = 0
    results = []
    rejoined: list[float] = []
    for per_step in calls:
        ratios_out, ratios_in, base_ms, out_ms, in_ms = [], [], [], [], []
        _steps(actors, None, 2, work_ms, per_step)  # warm
        for _ in range(rounds):
            base = _steps(actors, None, steps, work_ms, per_step, "base")
            rejoined.append(register()[1])  # members keep the configuration they had: a join that changes nothing
            out = _steps(actors, [next(out_window) for _ in range(steps)], steps, work_ms, per_step)
            inside = _steps(actors, [next(in_window) for _ in range(steps)], steps, work_ms, per_step, "in")
            captured_steps += steps
            profctx.ray.flush()
            profctx.reset()
            base_ms.append(base)
            out_ms.append(out)
            in_ms.append(inside)
            ratios_out.append(out / base)
            ratios_in.append(inside / base)
        results.append((per_step, base_ms, out_ms, in_ms, ratios_out, ratios_in))
    records = [r for r in read(save) if r.get("group") and r.get("status") == "ok"]
    expected = sum(selected) * captured_steps
    for a in actors:
        ray.kill(a)
    print(f"\n## real: {workers} actors in three groups {sizes}, {sum(selected)} selected {chosen}, tool={tool!r}; "
          f"a step is N phases, each one work({work_ms:g} ms) call to every actor; {rounds} rounds of {steps} steps "
          f"of each kind (actors started in {started:.1f} s)")
    print("| what | ms | x | target |")
    print("|---|---:|---:|---|")
    for per_step, base_ms, out_ms, in_ms, ratios_out, ratios_in in results:
        print(f"| N={per_step}: step, profctx not configured (baseline) | {statistics.median(base_ms):.1f} | 1.00 | |")
        print(f"| N={per_step}: step out of the window, groups registered | {statistics.median(out_ms):.1f} "
              f"| {statistics.median(ratios_out):.3f} ({min(ratios_out):.3f}-{max(ratios_out):.3f}) | <= 1.02 |")
        print(f"| N={per_step}: step in the window, {sum(selected)} members capture | {statistics.median(in_ms):.1f} "
              f"| {statistics.median(ratios_in):.3f} ({min(ratios_in):.3f}-{max(ratios_in):.3f}) | <= 1.5 |")
        base_cpu, in_cpu = (statistics.median(CPU[f"{k}:{per_step}"]) for k in ("base", "in"))
        print(f"| N={per_step}: driver CPU per step, baseline / in the window | {base_cpu:.2f} / {in_cpu:.2f} "
              f"| {in_cpu / base_cpu:.2f} | |")
        print(f"| N={per_step}: driver CPU added per selected member per in-window step | "
              f"{(in_cpu - base_cpu) / sum(selected):.3f} | | <= 0.3 |")
    print(f"| Ray: one no-op __ray_call__ to every actor | {ray_round * 1e3:.1f} | 1.00 | |")
    print(f"| group() of the three groups, fresh actors, until every member joined | {registered * 1e3:.1f} "
          f"| {registered / ray_round:.2f} | <= 2 |")
    print(f"| the three group() calls themselves (joins sent, not waited for) | {registered_sent * 1e3:.1f} "
          f"| {registered_sent / ray_round:.2f} | |")
    again = statistics.median(rejoined)
    print(f"| the same again, members holding the configuration (median of {len(rejoined)}) | {again * 1e3:.1f} "
          f"| {again / ray_round:.2f} | |")
    print(f"\ncaptures recorded: {len(records)}, expected {expected} (one per selected member per in-window step)")


# -- the simulated group ----------------------------------------------------------------------------


class _Ref:
    __slots__ = ("error", "ready_at", "value")

    def __init__(self, ready_at: float, value: Any = None, error: BaseException | None = None) -> None:
        self.ready_at, self.value, self.error = ready_at, value, error


class _Call:
    """A stand-in for ``ActorHandle.__ray_call__``."""

    __slots__ = ("handle",)

    def __init__(self, handle: StandIn) -> None:
        self.handle = handle

    def remote(self, fn: Callable[..., Any], *args: Any) -> _Ref:
        return self.handle.answer(fn.__name__, args)


class StandIn:
    """Answers profctx's control calls as an actor would, after a latency; ``fault``: "frozen" or "dead"."""

    calls = 0

    def __init__(self, index: int, latency: float, fault: str | None = None) -> None:
        self.index, self.latency, self.fault = index, latency, fault
        self.__ray_call__ = _Call(self)

    def answer(self, name: str, args: tuple[Any, ...]) -> _Ref:
        StandIn.calls += 1
        now = time.monotonic()
        if self.fault == "frozen":
            return _Ref(float("inf"))
        if self.fault == "dead":
            return _Ref(now, error=ray.exceptions.RayActorError())
        ready = now + self.latency * random.uniform(0.5, 1.5)
        if name == "join":
            spec = args[0]
            return _Ref(ready, {"pid": 10**6 + self.index, "host": "sim", "main": True, "undecorated": [],
                                "error": None, "save_path": spec.get("save_path"), "collect": False,
                                "identity": [spec["group"], spec["rank"]], "own": False,
                                "actor_id": f"{self.index:032x}", "engines": False})
        return _Ref(ready, True)


def _wait(refs: Sequence[_Ref], num_returns: int = 1, timeout: float | None = None) -> tuple[list[_Ref], list[_Ref]]:
    now = time.monotonic()
    if refs and num_returns:
        need = sorted(r.ready_at for r in refs)[num_returns - 1]
        until = min(need, now + timeout) if timeout is not None else need
        if until > now and until != float("inf"):
            time.sleep(until - now)
    now = time.monotonic()
    ready = [r for r in refs if r.ready_at <= now]
    return ready, [r for r in refs if r.ready_at > now]


def _get(ref: _Ref | list[_Ref], timeout: float | None = None) -> Any:
    if isinstance(ref, list):
        if timeout is not None and any(r.ready_at > time.monotonic() for r in ref):
            raise ray.exceptions.GetTimeoutError("not ready")
        return [_get(r, timeout) for r in ref]
    if ref.ready_at > time.monotonic():
        if timeout is None:
            _wait([ref])
        else:
            raise ray.exceptions.GetTimeoutError("not ready")
    if ref.error is not None:
        raise ref.error
    return ref.value


STAND_IN_RAY = types.SimpleNamespace(wait=_wait, get=_get, exceptions=ray.exceptions, is_initialized=lambda: True)


def _simulate(save: str, members: int, selected: int, latency: float, steps: int,
              faults: dict[str, float] | None = None, timeout: float = 0.2) -> dict[str, float]:
    """One simulated group: driver CPU and wall per step (ms), registration (ms), memory per member (bytes).

    Faults begin once the group is registered. Timing runs without ``tracemalloc`` (it slows every
    allocation); a second group of the same shape is then measured for memory.
    """
    out: dict[str, float] = {}
    for traced in (False, True):
        faults = faults or {}
        kinds: list[str | None] = []
        for kind, share in faults.items():
            kinds += [kind] * int(members * share)
        kinds += [None] * (members - len(kinds))
        random.Random(members).shuffle(kinds)
        handles = [StandIn(i, latency) for i in range(members)]
        profctx.configure(steps=f"1:{steps + 2}", mode="step", tool="noop", save_path=save, run_id="sim", warmup=False,
                          exit_hooks=False,
                          groups={"g": {"ranks": list(range(selected))}} if selected else {"other": {"ranks": [0]}})
        if traced:
            tracemalloc.start()
        m0 = tracemalloc.get_traced_memory()[0]
        t0 = time.perf_counter()
        profctx.ray.group("g", handles, control_timeout=timeout).members  # noqa: B018 - reading them waits for the joins
        registered = time.perf_counter() - t0
        if traced:
            out["bytes_per_member"] = (tracemalloc.get_traced_memory()[0] - m0) / members
        else:
            out["register_ms"] = registered * 1e3
        for handle, kind in zip(handles, kinds, strict=True):
            handle.fault = kind
        for name, first in (("in", 1), ("out", 10**6)):
            if name == "in":
                with profctx.profile_step(first):  # faults settle here (a frozen member is waited for once)
                    pass
                first += 1
            cpu, wall = [], []
            m1 = tracemalloc.get_traced_memory()[0]
            for step in range(first, first + steps):
                c0, w0 = time.thread_time(), time.perf_counter()
                with profctx.profile_step(step):
                    pass
                cpu.append(time.thread_time() - c0)
                wall.append(time.perf_counter() - w0)
            if traced:
                out[f"{name}_growth_per_step"] = (tracemalloc.get_traced_memory()[0] - m1) / steps
            else:
                out[f"{name}_cpu_ms"] = statistics.median(cpu) * 1e3
                out[f"{name}_wall_ms"] = statistics.median(wall) * 1e3
        tracemalloc.stop()
        profctx.reset()
    return out


def _slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    mx, my = statistics.mean(xs), statistics.mean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def bench_sim(save: str, latency_ms: float, steps: int) -> None:
    latency = latency_ms / 1e3
    real = (profctx.ray._driver.ray, profctx.ray._control.ray)
    profctx.ray._driver.ray = profctx.ray._control.ray = STAND_IN_RAY  # type: ignore[attr-defined]
    logging.getLogger("profctx").setLevel(logging.ERROR)  # a lost member is logged once; hundreds here
    try:
        print(f"\n## sim: one group, stand-in members answering after {latency_ms:g} ms ± 50 %; "
              f"median of {steps} steps; driver CPU = its thread's CPU time")
        print("| members | selected | in-window step: driver CPU | wall | out of window: CPU | registration "
              "| driver bytes per member | growth per in-window step |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|")
        by_members: list[tuple[int, dict[str, float]]] = []
        for n in (64, 128, 256, 512, 1024):
            r = _simulate(save, n, 18, latency, steps)
            by_members.append((n, r))
            _row(n, 18, r)
        by_selected: list[tuple[int, dict[str, float]]] = []
        for s in (0, 64, 256, 1024):
            r = _simulate(save, 1024, s, latency, steps)
            by_selected.append((s, r))
            _row(1024, s, r)
        for label, faults in (("5 % frozen", {"frozen": 0.05}), ("5 % dead", {"dead": 0.05})):
            r = _simulate(save, 1024, 1024, latency, steps, faults)
            _row(1024, 1024, r, label)
        xs = [float(n) for n, _ in by_members]
        print(f"\nslopes: per member (18 selected): in-window driver CPU "
              f"{_slope(xs, [r['in_cpu_ms'] for _, r in by_members]) * 1e3:.2f} µs, out of window "
              f"{_slope(xs, [r['out_cpu_ms'] for _, r in by_members]) * 1e3:.3f} µs, registration "
              f"{_slope(xs, [r['register_ms'] for _, r in by_members]) * 1e3:.1f} µs, memory "
              f"{statistics.mean(r['bytes_per_member'] for _, r in by_members):.0f} bytes")
        xs = [float(s) for s, _ in by_selected]
        print(f"slopes: per selected member (1,024 members): in-window driver CPU "
              f"{_slope(xs, [r['in_cpu_ms'] for _, r in by_selected]) * 1e3:.2f} µs, wall "
              f"{_slope(xs, [r['in_wall_ms'] for _, r in by_selected]) * 1e3:.2f} µs")
    finally:
        profctx.ray._driver.ray, profctx.ray._control.ray = real  # type: ignore[attr-defined]


def _row(n: int, s: int, r: dict[str, float], label: str = "") -> None:
    print(f"| {n}{' (' + label + ')' if label else ''} | {s} | {r['in_cpu_ms']:.2f} ms | {r['in_wall_ms']:.2f} ms "
          f"| {r['out_cpu_ms'] * 1e3:.1f} µs | {r['register_ms']:.1f} ms | {r['bytes_per_member']:.0f} "
          f"| {r['in_growth_per_step']:.0f} B |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="real,sim")
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--selected", default="8,5,5", help="selected members of actor, critic, rollout")
    parser.add_argument("--tool", default="noop")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--work-ms", type=float, default=20.0)
    parser.add_argument("--calls", default="1,3", help="phases per step (one call to every actor each), per run")
    parser.add_argument("--latency-ms", type=float, default=1.0)
    parser.add_argument("--sim-steps", type=int, default=100)
    args = parser.parse_args()
    only = set(args.only.split(","))
    with tempfile.TemporaryDirectory() as save:
        if "sim" in only:
            bench_sim(save, args.latency_ms, args.sim_steps)
        if "ride" in only or "real" in only:
            ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False,
                     runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(
                         p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)}})
            try:
                if "ride" in only:
                    bench_ride(args.workers, sum(int(k) for k in args.selected.split(",")), args.rounds, args.steps,
                               args.work_ms)
                if "real" in only:
                    bench_real(save, args.workers, [int(k) for k in args.selected.split(",")], args.tool,
                               args.rounds, args.steps, args.work_ms, [int(c) for c in args.calls.split(",")])
            finally:
                ray.shutdown()


if __name__ == "__main__":
    main()

"""Running-side cost of blocks that open nothing, against the Python floor (issue 25 item 8).

The floor is what any exact block must do: a ``with`` over a Python object whose ``__enter__``
sets a new object into a ``ContextVar`` and whose ``__exit__`` resets it. Every row is a ratio
to that floor, timed in alternation with it in this one process (thread CPU time, best of many
short runs), so the machine's load moves both alike.

Run by hand: ``python benchmarks/bench_blocks.py [--quick]``. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import timeit
from contextvars import ContextVar
from typing import Any

import profctx
from profctx.core._scope import SCOPE, Scope, Unfrozen

_VAR: ContextVar[object] = ContextVar("floor", default=None)


class Floor:
    """A block that sets a new object into a ContextVar and resets it: the floor."""

    __slots__ = ("_token", "role")

    def __init__(self, role: str | None = None) -> None:
        self.role = role

    def __enter__(self) -> object:
        new = object()
        self._token = _VAR.set(new)
        return new

    def __exit__(self, *exc: object) -> None:
        _VAR.reset(self._token)


class Exact:
    """The least a step block that keeps ``current()`` exact does: build the child ``Scope``, set it, reset it.

    No test, no timeline, no window: what is left over the floor is the scope itself (reading the
    parent, and a ``Scope`` costs about 130 ns to build against ``object()``'s 40 here).
    """

    __slots__ = ("_token", "step")

    def __init__(self, step: int) -> None:
        self.step = step

    def __enter__(self) -> object:
        parent = SCOPE.get()
        new = Unfrozen()
        new.step = self.step
        new.roles = parent.roles
        new._tags = parent._tags
        new._kids = None
        new.__class__ = Scope  # type: ignore[assignment]
        self._token = SCOPE.set(new)  # type: ignore[arg-type]
        return new

    def __exit__(self, *exc: object) -> None:
        SCOPE.reset(self._token)


def floor() -> None:
    with Floor(role="r"):
        pass


@profctx.profiled(role="bench")
def decorated() -> int:
    return 1


def bare() -> int:
    return 1


def best(stmt: str, env: dict[str, Any], number: int) -> float:
    return min(timeit.repeat(stmt, number=number, repeat=1, globals=env, timer=time.thread_time)) / number * 1e9


def paired(stmt: str, base: str, env: dict[str, Any], number: int, rounds: int) -> tuple[float, float]:
    """Best ns of ``stmt`` and of ``base``, timed in alternation (``rounds`` short runs of each)."""
    ours, theirs = float("inf"), float("inf")
    for _ in range(rounds):
        theirs = min(theirs, best(base, env, number))
        ours = min(ours, best(stmt, env, number))
    return ours, theirs


def rows(number: int, rounds: int) -> list[tuple[str, float, float, str]]:
    env: dict[str, Any] = {"profile_step": profctx.profile_step, "Floor": Floor, "decorated": decorated,
                           "bare": bare, "Exact": Exact}
    floor_stmt = "with Floor(role='r'): pass"
    out: list[tuple[str, float, float, str]] = []

    def row(label: str, stmt: str, target: str, base: str = floor_stmt) -> None:
        t, b = paired(stmt, base, env, number, rounds)
        out.append((label, t, t / b, target))

    profctx.reset()
    t, b = paired(floor_stmt, "bare()", env, number, rounds)
    out.append(("floor: `with` setting a new object into a ContextVar (vs bare call)", t, t / b, ""))
    row("reference: the least an exact step block does (build the child Scope, set, reset; no test)",
        "with Exact(2): pass", "")
    row("`with profile_step(step)`, not configured", "with profile_step(2): pass", "<= 1.3")
    row("`with profile_step(role=...)`, not configured", "with profile_step(role='r'): pass", "<= 1.3")
    with tempfile.TemporaryDirectory() as tmp:
        profctx.configure(steps=[10**6], save_path=tmp, tool="noop", warmup=False)
        row("`with profile_step(step)`, out of window", "with profile_step(2): pass", "<= 1.3")
        with profctx.profile_step(1):
            row("nested `with profile_step(role=...)`, out-of-window step", "with profile_step(role='r'): pass",
                "<= 1.3")
            out_window, _ = paired("with profile_step(role='r'): pass", floor_stmt, env, number, rounds)
        profctx.configure(steps=[5], save_path=tmp, tool="noop", warmup=False, ranks=[0], rank=1, world_size=2)
        with profctx.profile_step(5):
            row("nested `with profile_step(role=...)`, in-window step, rank not selected",
                "with profile_step(role='r'): pass", "<= 1.3")
            in_window, _ = paired("with profile_step(role='r'): pass", floor_stmt, env, number, rounds)
        out.append(("  the same, in window / out of window", in_window, in_window / out_window, "<= 1.0"))
        profctx.configure(steps=[5], save_path=tmp, tool="noop", warmup=False, mode="role", roles=["rollout"])
        with profctx.profile_step(5):
            row("`@profiled` call, in-window step (role mode), role filtered out", "decorated()", "<= 1.2")
            row("nested `with profile_step(role=...)`, in-window step (role mode), role filtered out",
                "with profile_step(role='r'): pass", "<= 1.3")
        # Where the time goes: the step timeline times a step and a role directly under it (a clock
        # read at entry, one at exit and an append); a role under a role is not timed.
        profctx.configure(steps=[10**6], save_path=tmp, tool="noop", warmup=False)
        with profctx.profile_step(1), profctx.profile_step(role="outer"):
            row("nested `with profile_step(role=...)` under a role, out-of-window step (not timed)",
                "with profile_step(role='r'): pass", "<= 1.3")
        profctx.configure(steps=[10**6], save_path=tmp, tool="noop", warmup=False, timeline=False)
        row("`with profile_step(step)`, out of window, timeline=False", "with profile_step(2): pass", "<= 1.3")
        with profctx.profile_step(1):
            row("nested `with profile_step(role=...)`, out-of-window step, timeline=False",
                "with profile_step(role='r'): pass", "<= 1.3")
            out_window, _ = paired("with profile_step(role='r'): pass", floor_stmt, env, number, rounds)
        profctx.configure(steps=[5], save_path=tmp, tool="noop", warmup=False, ranks=[0], rank=1, world_size=2,
                          timeline=False)
        with profctx.profile_step(5):
            in_window, _ = paired("with profile_step(role='r'): pass", floor_stmt, env, number, rounds)
        out.append(("  in window / out of window (rank not selected), timeline=False", in_window,
                    in_window / out_window, "<= 1.0"))
        profctx.reset()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    args = parser.parse_args()
    number, rounds = (2_000, 20) if args.quick else (4_000, 60)
    print(f"Python {sys.version.split()[0]}\n")
    print("| block | ns | x floor | target |")
    print("|---|---:|---:|---|")
    for label, t, ratio, target in rows(number, rounds):
        print(f"| {label} | {t:.0f} | {ratio:.2f} | {target} |")


if __name__ == "__main__":
    main()

"""``profctx trigger DIR --steps N``: ask the live run writing to DIR to profile its next N steps.

The run must be configured with ``on_demand=True``. Every live process writing to DIR
publishes its step, and the state of the requests it read, in ``DIR/.profctx/live/``. The
request names the run and a count, and no step: the run's deciding process (its only process,
the Ray driver, or rank 0) names the first step from its own progress, the step after the one it
enters next, and tells the other ranks (see :mod:`profctx.process._ondemand`), so no clock of
the CLI's is compared with the run's. The request is written into ``DIR/.profctx/requests/`` (a
fresh temporary renamed into place); the CLI then waits for the run to say which steps it will
capture, or why it refuses (exit code 1): an overlap with a request still to capture, the cap,
ranks the run does not have.
"""

from __future__ import annotations

import argparse
import getpass
import json
import math
import os
import re
import time
from pathlib import Path
from typing import Any

from ..core._layout import MANIFEST_DIR
from ..core._ondemand import MAX_REQUEST_STEPS, Request, RequestError
from ..core._vocab import MODES
from ..process._ondemand import HEARTBEAT_S, POLL_S, REQUESTS, STALE_S, live_processes, write_request
from ..util._fs import walk
from ._common import FINDINGS, OK, UsageError, guarded

#: Request files of this user older than this are removed when a new request is written.
KEEP_S = 3600.0
#: Seconds the CLI waits, by default, for the run to say which steps it captures.
WAIT_S = 10.0
#: Seconds between two looks at the run's progress files while waiting.
LOOK_S = 0.1
#: The names of request files (what :func:`_forget_old` may delete).
_REQUEST_FILE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*\.json")


def register(subparsers: Any) -> None:
    """Add the ``trigger`` subcommand."""
    parser = subparsers.add_parser(
        "trigger",
        help="ask a live run (configured with on_demand=True) to profile its next N steps",
        description="Ask the live run writing to DIR (its save_path) to profile N steps: the steps after the one "
                    "its deciding process (the only process, the Ray driver, or rank 0) enters next; every process "
                    "captures the same steps. The run must be configured with on_demand=True. Waits for the run to "
                    "say which steps (--wait). Exit code 1 when no live process of such a run writes to DIR, or "
                    "the run refuses the request (steps overlapping a request still to capture, its cap reached, "
                    "ranks it does not have).",
    )
    parser.add_argument("dir", metavar="DIR", help="the save_path of the live run")
    parser.add_argument("--steps", type=int, required=True, metavar="N",
                        help=f"how many consecutive steps to profile (1 to {MAX_REQUEST_STEPS})")
    parser.add_argument("--mode", choices=MODES, help="one capture per step, or per role "
                        "(default: the run's mode)")
    parser.add_argument("--roles", metavar="R1,R2", help="role names or fnmatch patterns to capture or draw "
                        "(default: the run's roles)")
    parser.add_argument("--group", metavar="G", help="only members of this Ray worker group capture")
    parser.add_argument("--ranks", metavar="R1,R2", help="only these ranks capture (in --group when given)")
    parser.add_argument("--run", metavar="ID", help="the run to ask, when several live runs write to DIR")
    parser.add_argument("--wait", type=float, default=WAIT_S, metavar="S",
                        help=f"seconds to wait for the run to name the steps (default {WAIT_S:g}; 0: do not wait)")
    parser.add_argument("--json", action="store_true", help="print the request written, and the run's answer, as JSON")
    parser.set_defaults(func=guarded(run))


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(sorted({int(p) for p in text.replace(" ", "").split(",") if p}))
    except ValueError:
        raise UsageError(f"--ranks {text!r}: a comma-separated list of integers >= 0, e.g. 0,1") from None
    if not values or any(v < 0 for v in values):
        raise UsageError(f"--ranks {text!r}: a comma-separated list of integers >= 0, e.g. 0,1")
    return values


def live(path: Path) -> list[dict[str, Any]]:
    """Return the progress of the live on-demand processes writing to ``path``.

    On this host a process is live while its pid is (no clock read). A file from another host
    whose time looks stale by this host's clock is looked at again after one heartbeat: it is
    live if it changed since, so a clock that differs from the run's hides no live process.
    """
    found = [p for p in live_processes(path, time.time(), stale_s=math.inf) if p.get("on_demand")]
    here = os.uname().nodename
    doubtful = [p for p in found if p.get("host") != here and not time.time() - float(p.get("time") or 0) < STALE_S]
    if not doubtful:
        return found
    time.sleep(HEARTBEAT_S + POLL_S)
    again = {(p.get("host"), p.get("pid")): p for p in live_processes(path, time.time(), stale_s=math.inf)}
    keep = []
    for p in found:
        if p in doubtful:
            now = again.get((p.get("host"), p.get("pid")))
            if now is None or (now.get("time"), now.get("step")) == (p.get("time"), p.get("step")):
                continue
        keep.append(p)
    return keep


def refusal(processes: list[dict[str, Any]], ranks: tuple[int, ...] | None, group: str | None) -> str | None:
    """Return why the live run cannot honour a new request, as its progress files tell; ``None``: it may.

    An overlap with a request still to capture is the run's to refuse (it records why): the CLI
    writes the request and prints the run's answer.
    """
    deciders = [p for p in processes if p.get("decides")]
    if deciders and all(p.get("left") == 0 for p in deciders):
        return "the run accepted on_demand_max_captures requests already"
    if ranks is not None and group is None:
        sizes: list[int] = [p["world_size"] for p in processes if type(p.get("world_size")) is int]
        world = max(sizes, default=0)
        beyond = [r for r in ranks if world and r >= world]
        if beyond:
            return f"--ranks {','.join(map(str, beyond))}: the run has ranks 0-{world - 1}"
    return None


def run(args: argparse.Namespace) -> int:
    """Write the request and wait for the run's answer; return 1 when no live process takes it or the run refuses."""
    if not 1 <= args.steps <= MAX_REQUEST_STEPS:
        raise UsageError(f"--steps {args.steps}: must be from 1 to {MAX_REQUEST_STEPS}")
    if not args.wait >= 0 or not math.isfinite(args.wait):
        raise UsageError(f"--wait {args.wait}: seconds, 0 or more")
    path = Path(args.dir).expanduser()
    if not (path / MANIFEST_DIR).is_dir():
        raise UsageError(f"{args.dir}: not the save_path of a profctx run (no {MANIFEST_DIR} folder inside)")
    roles = None
    if args.roles is not None:
        roles = tuple(r.strip() for r in args.roles.split(","))
        if not all(roles):
            raise UsageError(f"--roles {args.roles!r}: role names or patterns separated by single commas")
    ranks = _ints(args.ranks) if args.ranks is not None else None
    processes = live(path)
    runs = sorted({str(p.get("run")) for p in processes})
    if args.run is not None:
        processes = [p for p in processes if p.get("run") == args.run]
    elif len(runs) > 1:
        raise UsageError(f"several live runs write to {args.dir} ({', '.join(runs)}): name one with --run")
    if not processes:
        which = f" of run {args.run}" if args.run else ""
        print(f"profctx trigger: no live process{which} configured with on_demand=True writes to {args.dir}",
              flush=True)
        return FINDINGS
    run_id = str(processes[0].get("run"))
    why = refusal(processes, ranks, args.group)
    if why is not None:
        print(f"profctx trigger: refused: {why}", flush=True)
        return FINDINGS
    try:
        user: str | None = getpass.getuser()
    except Exception:  # noqa: BLE001 - no name for this uid: the uid names the user
        user = None
    now = time.time()
    try:
        request = Request(
            id=time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + "-" + os.urandom(4).hex(), first=None,
            count=args.steps, mode=args.mode, roles=roles, group=args.group, ranks=ranks, origin="trigger",
            user=user, uid=os.getuid(), host=os.uname().nodename, pid=os.getpid(), time=now, run=run_id)
    except RequestError as exc:
        raise UsageError(str(exc)) from None
    _forget_old(path, now)
    try:
        written = write_request(path, request)
    except OSError as exc:
        raise UsageError(_refused(path, exc)) from None
    state = _answer(path, run_id, request.id, args.wait)
    if args.json:
        print(json.dumps({**request.to_dict(), "answer": state}, indent=2))
        return FINDINGS if state is not None and state.get("state") == "refused" else OK
    if state is None or state.get("state") == "pending":
        print(f"asked run {run_id} ({len(processes)} live process(es)) to capture the {args.steps} step(s) after "
              f"the one it enters next (request {request.id}, {written}); it had not named them within "
              f"{args.wait:g} s (a long step); see them with: profctx ls {args.dir}")
        return OK
    if state.get("state") == "refused":
        print(f"profctx trigger: refused by run {run_id}: {state.get('why')}")
        return FINDINGS
    first, last = state.get("first"), state.get("last")
    steps = f"step {first}" if first == last else f"steps {first}-{last}"
    print(f"run {run_id} captures {steps} on its {len(processes)} live process(es) (request {request.id}, "
          f"{written}); see them with: profctx ls {args.dir}")
    return OK


def _answer(path: Path, run_id: str, rid: str, wait: float) -> dict[str, Any] | None:
    """Return the deciding process's state of request ``rid`` once not pending, or the last seen after ``wait`` s."""
    deadline = time.monotonic() + wait
    seen: dict[str, Any] | None = None
    while True:
        for p in live_processes(path, time.time(), stale_s=math.inf):
            if p.get("run") == run_id and p.get("decides"):
                state = (p.get("requests") or {}).get(rid)
                if isinstance(state, dict):
                    seen = state
        if seen is not None and seen.get("state") != "pending":
            return seen
        if time.monotonic() >= deadline:
            return seen
        time.sleep(LOOK_S)


def _forget_old(path: Path, now: float) -> None:
    """Remove this user's request files older than :data:`KEEP_S` (every process has read them long ago).

    Only entries of the requests folder reached by descriptor, each component walked without
    following a link, that are regular files of this user named like requests: a link planted at
    ``requests`` (or above) raises ``UsageError`` before anything is deleted.
    """
    try:
        folder = walk(path, f"{MANIFEST_DIR}/{REQUESTS}", create=False)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise UsageError(_refused(path, exc)) from None
    with folder:
        try:
            entries = folder.entries()
        except OSError:
            return
        for entry in entries:
            folder.remove(entry.name, _REQUEST_FILE, owner=os.getuid(), older_than=now - KEEP_S)


def _refused(path: Path, exc: OSError) -> str:
    """Say why the requests folder of ``path`` is not used (a link where a folder belongs, most likely)."""
    return (f"{path / MANIFEST_DIR / REQUESTS}: not used: {exc.strerror or exc} (a link or file where profctx's "
            "folder belongs is never followed; remove it, or ask who owns the folder)")

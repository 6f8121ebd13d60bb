"""``profctx trigger DIR --steps N``: ask the live run writing to DIR to profile its next N steps.

The run must be configured with ``on_demand=True``. Every live process writing to DIR
publishes its step in ``DIR/.profctx/live/``; the request names an absolute first step far
enough ahead of the furthest of them (:func:`profctx.core._ondemand.first_step`) that every rank
captures the same steps. It is written into ``DIR/.profctx/requests/`` (a fresh temporary
renamed into place); each process reads it at its next look (every half second).
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import time
from pathlib import Path
from typing import Any

from ..core._layout import MANIFEST_DIR
from ..core._ondemand import MAX_REQUEST_STEPS, Progress, Request, RequestError, first_step
from ..core._vocab import MODES
from ..process._ondemand import REQUESTS, STALE_S, live_processes, write_request
from ._common import FINDINGS, OK, UsageError, guarded

#: Request files of this user older than this are removed when a new request is written.
KEEP_S = 3600.0
#: Seconds the CLI watches a process that has not published its pace yet (two of its looks).
WATCH_S = 1.0


def register(subparsers: Any) -> None:
    """Add the ``trigger`` subcommand."""
    parser = subparsers.add_parser(
        "trigger",
        help="ask a live run (configured with on_demand=True) to profile its next N steps",
        description="Ask the live run writing to DIR (its save_path) to profile N steps from a step far enough "
                    "ahead that every process captures the same steps (at least 2 steps and 2 seconds ahead of the "
                    "furthest process). The run must be configured with on_demand=True. Exit code 1 when no "
                    "live process of such a run writes to DIR.",
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
    parser.add_argument("--json", action="store_true", help="print the request written, as JSON")
    parser.set_defaults(func=guarded(run))


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(sorted({int(p) for p in text.replace(" ", "").split(",") if p}))
    except ValueError:
        raise UsageError(f"--ranks {text!r}: a comma-separated list of integers >= 0, e.g. 0,1") from None
    if not values or any(v < 0 for v in values):
        raise UsageError(f"--ranks {text!r}: a comma-separated list of integers >= 0, e.g. 0,1")
    return values


def run(args: argparse.Namespace) -> int:
    """Write the request; return 1 when no live on-demand process writes to ``args.dir``."""
    if not 1 <= args.steps <= MAX_REQUEST_STEPS:
        raise UsageError(f"--steps {args.steps}: must be from 1 to {MAX_REQUEST_STEPS}")
    path = Path(args.dir).expanduser()
    if not (path / MANIFEST_DIR).is_dir():
        raise UsageError(f"{args.dir}: not the save_path of a profctx run (no {MANIFEST_DIR} folder inside)")
    roles = None
    if args.roles is not None:
        roles = tuple(r.strip() for r in args.roles.split(","))
        if not all(roles):
            raise UsageError(f"--roles {args.roles!r}: role names or patterns separated by single commas")
    now = time.time()
    live = [p for p in live_processes(path, now) if p.get("on_demand")]
    if not live:
        print(f"profctx trigger: no live process configured with on_demand=True writes to {args.dir} (none "
              f"published its progress in the last {STALE_S:.0f} s)", flush=True)
        return FINDINGS
    if any(type(p.get("period")) not in (int, float) for p in live):
        # A process that has not published its pace yet: watch it for a moment (see _progress).
        time.sleep(WATCH_S)
        before, now = live, time.time()
        live = [p for p in live_processes(path, now) if p.get("on_demand")] or before
        progress = _progress(before, live)
    else:
        progress = _progress(live, live)
    first = first_step(progress, now)
    if first is None:
        print(f"profctx trigger: the run writing to {args.dir} has not entered a step yet; try again once it has")
        return FINDINGS
    try:
        user: str | None = getpass.getuser()
    except Exception:  # noqa: BLE001 - no name for this uid: the uid names the user
        user = None
    try:
        request = Request(
            id=time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + "-" + os.urandom(4).hex(), first=first,
            count=args.steps, mode=args.mode, roles=roles, group=args.group,
            ranks=_ints(args.ranks) if args.ranks is not None else None, origin="trigger", user=user,
            uid=os.getuid(), host=os.uname().nodename, pid=os.getpid(), time=now)
    except RequestError as exc:
        raise UsageError(str(exc)) from None
    _forget_old(path, now)
    written = write_request(path, request)
    if args.json:
        print(json.dumps(request.to_dict(), indent=2))
    else:
        last = first + args.steps - 1
        steps = f"step {first}" if first == last else f"steps {first}-{last}"
        runs = sorted({str(p.get("run")) for p in live})
        print(f"asked {len(live)} live process(es) of run {', '.join(runs)} to capture {steps} "
              f"(request {request.id}, {written}); see them with: profctx ls {args.dir}")
    return OK


def _progress(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> list[Progress]:
    """Return each live process's progress; a pace it did not publish is measured from the two readings.

    A process whose step did not move between the readings (:data:`WATCH_S` apart) takes at least
    that long per step: that lower bound is its pace (the margin of 2 steps then covers 2 seconds).
    """
    earlier = {(p.get("host"), p.get("pid")): p for p in before}
    out = []
    for p in after:
        step, when, published = p.get("step"), p.get("time"), p.get("period")
        if type(step) is not int or not isinstance(when, (int, float)):
            continue
        period = float(published) if isinstance(published, (int, float)) and published > 0 else None
        if period is None:
            old = earlier.get((p.get("host"), p.get("pid"))) or {}
            old_step, old_when = old.get("step"), old.get("time")
            if type(old_step) is int and isinstance(old_when, (int, float)) and when > old_when:
                period = (when - old_when) / (step - old_step) if step > old_step else max(WATCH_S, when - old_when)
        out.append(Progress(step, period, float(when)))
    return out


def _forget_old(path: Path, now: float) -> None:
    """Remove this user's request files older than :data:`KEEP_S` (every process has read them long ago)."""
    folder = path / MANIFEST_DIR / REQUESTS
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        try:
            info = entry.stat(follow_symlinks=False)
            if entry.name.endswith(".json") and info.st_uid == os.getuid() and now - info.st_mtime > KEEP_S:
                os.unlink(entry.path)
        except OSError:
            continue

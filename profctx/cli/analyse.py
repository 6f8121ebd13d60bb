"""``profctx summary``, ``diff`` and ``check``: phase breakdown, stragglers, deltas and a regression gate."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..analysis import Diff, Summary, Threshold, Violation, check, diff, parse_threshold, summarize
from ..analysis._parallel import AUTO
from ..manifest import MAX_LINE, ManifestReader, latest_run
from ..records._job import hole
from ..util._errors import ConfigError
from ..util._untrusted import open_regular
from ._common import FINDINGS, OK, Progress, Style, UsageError, check_folder, guarded, table


def register(subparsers: Any) -> None:
    """Add the ``summary``, ``diff`` and ``check`` subcommands."""
    summary = subparsers.add_parser(
        "summary",
        help="phase breakdown per step, stragglers and top operators of a run",
        description="Read a run's manifest and traces (streamed) and print, per step, each role's time (the "
                    "slowest process) and share of the step, the stragglers (a process slower than the median "
                    "by more than --straggler-ratio), each role's trend over steps and its top operators by self "
                    "time. --json prints the versioned 'profctx.summary' document (docs/analysis.md).",
    )
    summary.add_argument("dir", metavar="DIR", help="the save_path of the run")
    summary.add_argument("--run", default="latest", metavar="ID", help="run id, 'latest' (default) or 'all'")
    summary.add_argument("--step", type=int, action="append", metavar="S", help="only step S (repeatable)")
    _common_flags(summary)
    summary.set_defaults(func=guarded(run_summary))

    compare = subparsers.add_parser(
        "diff",
        help="what changed between two runs, or two steps of one run, per role and operator",
        description="Compare A and B: per role, its time per step (slowest process, mean over steps) and, per "
                    "role, the operators whose self time per process and step changed most. Two runs: "
                    "'profctx diff BASE_DIR NEW_DIR' (latest run of each; --base-run/--run choose, also within one "
                    "folder). Two steps: 'profctx diff DIR --steps 3 50'.",
    )
    compare.add_argument("base", metavar="A", help="save_path of the baseline (or of both, with --steps)")
    compare.add_argument("new", metavar="B", nargs="?", help="save_path of the run compared (default: A)")
    compare.add_argument("--base-run", metavar="ID", default="latest", help="run of A (default latest)")
    compare.add_argument("--run", metavar="ID", default="latest", help="run of B (default latest)")
    compare.add_argument("--steps", type=int, nargs=2, metavar=("SA", "SB"), help="compare step SA with step SB")
    compare.add_argument("--ops", type=int, default=5, metavar="N", help="operators listed per role (default 5)")
    _common_flags(compare)
    compare.set_defaults(func=guarded(run_diff))

    gate = subparsers.add_parser(
        "check",
        help="fail (exit 1) when a role or operator got slower than allowed against a baseline run",
        description="Regression gate for CI: compare RUN with --baseline like 'profctx diff' and exit 1, with a "
                    "table, when a role or operator is slower than its threshold. Thresholds: --max-slowdown "
                    "ROLE=PCT%% and --max-op-slowdown OP=PCT%% (fnmatch patterns, repeatable, first match wins; "
                    "default '*=10%%' for roles, none for operators). Deltas under --min-ms never fail.",
    )
    gate.add_argument("dir", metavar="RUN", help="save_path of the run checked")
    gate.add_argument("--baseline", metavar="DIR", required=True, help="save_path of the baseline run")
    gate.add_argument("--run", metavar="ID", default="latest", help="run id in RUN (default latest)")
    gate.add_argument("--baseline-run", metavar="ID", default="latest", help="run id in the baseline (default latest)")
    gate.add_argument("--max-slowdown", action="append", metavar="ROLE=PCT%", default=[],
                      help="largest allowed slowdown of matching roles, e.g. actor_update=10%%")
    gate.add_argument("--max-op-slowdown", action="append", metavar="OP=PCT%", default=[],
                      help="largest allowed slowdown of matching operators, e.g. 'aten::mm=25%%'")
    gate.add_argument("--min-ms", type=float, default=1.0, metavar="MS",
                      help="ignore slowdowns smaller than this many milliseconds (default 1)")
    _common_flags(gate)
    gate.set_defaults(func=guarded(run_check))


def _common_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--group", action="append", metavar="NAME",
                        help="only processes of worker group NAME ('driver': those outside every group; repeatable)")
    parser.add_argument("--json", action="store_true", help="print the JSON document instead of tables")
    parser.add_argument("--straggler-ratio", type=float, default=1.2, metavar="R",
                        help="name a straggler when its work in a role (or before the step) exceeds R times the "
                             "median of the other processes' (default 1.2)")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="show a progress bar while traces are read (default: when stderr is a terminal)")
    parser.add_argument("--jobs", type=jobs_option, metavar="N",
                        help="processes reading traces (default: one per CPU when there are enough traces to gain)")


def _summarize(folder: str, run: str, args: argparse.Namespace, steps: list[int] | None = None,
               top: int = 15) -> Summary:
    path = check_folder(folder)
    chosen = None if run == "all" else (latest_run(path) if run == "latest" else run)
    if chosen is not None and not any(True for _ in _reader(path, chosen)):
        raise UsageError(f"run {chosen!r}: not found in {folder}")
    if args.straggler_ratio <= 1:
        raise UsageError(f"--straggler-ratio {args.straggler_ratio}: must be greater than 1")
    show = sys.stderr.isatty() if args.progress is None else args.progress
    bar = Progress(sys.stderr, "reading traces", show)
    try:
        return summarize(path, chosen, steps=steps, top=top, straggler_ratio=args.straggler_ratio,
                         progress=bar.update, groups=args.group, jobs=args.jobs or AUTO)
    finally:
        bar.close()


def jobs_option(text: str) -> int:
    """Parse ``--jobs``: a number of processes, 1 or more."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a number of processes, 1 or more")
    return value


def _reader(path: Any, run: str) -> Any:
    return ManifestReader(path, run).lines()


def seconds(s: float | None) -> str:
    """Return a duration with three significant digits: ``812 us``, ``4.21 ms``, ``1.30 s``."""
    if s is None:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.0f} us"
    if s < 1:
        return f"{s * 1e3:.3g} ms"
    return f"{s:.3g} s"


def _pct(value: float | None) -> str:
    return "new" if value is None else f"{value:+.1%}"


def run_summary(args: argparse.Namespace) -> int:
    """Print the summary of a run."""
    result = _summarize(args.dir, args.run, args, sorted(set(args.step)) if args.step else None)
    note = left_out_note(args.dir, result.run) if args.run == "latest" else None
    if args.json:
        json.dump(result.to_json(), sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
        if result.missing:
            print(hole(result.missing, "capture record"), file=sys.stderr)
        if note:
            print(note, file=sys.stderr)
        return OK
    print(render_summary(result, Style(sys.stdout)))
    if result.missing:
        print(f"\n{hole(result.missing, 'capture record')}")
    if note:
        print(f"\n{note}")
    return OK


def left_out_note(folder: str, shown: str | None) -> str | None:
    """Return the note that other runs under ``folder`` were left out of run ``shown``, or ``None`` when none were.

    Reads the first line of each manifest shard (a shard holds one process of one run).
    """
    if shown is None:
        return None
    others: set[str] = set()
    for shard in ManifestReader(folder).shards():
        try:
            with open_regular(shard, folder) as handle:  # the folder is untrusted: a FIFO must not block
                run = json.loads(handle.readline(MAX_LINE + 1)).get("run")
        except (OSError, ValueError, AttributeError, RecursionError):
            continue
        if isinstance(run, str) and run != shown:
            others.add(run)
    if not others:
        return None
    count = f"{len(others)} other run{'s' if len(others) > 1 else ''}"
    return (f"note: {count} in this folder left out (shown: the latest run, {shown}); --run all shows every "
            f"run, --run ID one of them ('profctx ls {folder}' lists them)")


def render_summary(result: Summary, style: Style) -> str:
    """Return the summary as terminal tables: phases per step, stragglers, trends, top operators."""
    out = [style(f"run {result.run or 'all'}: {len(result.steps)} steps, {len(result.processes)} processes, "
                 f"{len(result.captures)} captures", "bold")]
    if not result.phases:
        out.append("no completed captures with a single step: nothing to break down")
    rows = []
    device = any(p.device_s is not None for p in result.phases)  # a column only where traces hold device events
    waits = any(p.wait_s > 0 for p in result.phases)  # a column only where a process waited for the others
    for p in sorted(result.phases, key=lambda p: (p.step, -p.work_s, -p.time_s)):  # the largest work first
        rows.append([str(p.step), p.role, seconds(p.time_s), f"{p.share:.0%}", seconds(p.no_op_s),
                     *([seconds(p.device_s)] if device else []), *([seconds(p.wait_s)] if waits else []),
                     seconds(p.median_s), f"{p.ratio:.2f}", p.straggler or ""])
        for child, spent in sorted(p.nested.items(), key=lambda kv: -kv[1]):
            rows.append(["", f"  {child}", seconds(spent), "", "", *([""] if device else []), *([""] if waits else []),
                         "", "", ""])
        if p.nested:
            rest = max(p.time_s - sum(p.nested.values()), 0.0)
            rows.append(["", f"  (rest of {p.role})", seconds(rest), "", "", *([""] if device else []),
                         *([""] if waits else []), "", "", ""])
    if rows:
        heads = ["STEP", "ROLE", "TIME", "SHARE", "NO-OP", *(["DEVICE"] if device else []),
                 *(["WAIT"] if waits else []), "MEDIAN", "MAX/MED", "STRAGGLER"]
        out += ["", style("Phases (time: slowest process, its range; share of the step; no-op: its time in no "
                          "operator" + ("; device: kernels and copies it launched" if device else "")
                          + ("; wait: the longest a process waited there for the others" if waits else "")
                          + "; max/med: the largest work (time less wait) over the other processes' median; "
                          "nested roles indented under their parent)", "bold"),
                table(heads, rows, right=set(range(len(heads) - 1)) - {1})]
    if result.overhead:
        out.append("profiler start/stop, not in any role (slowest process): "
                   + ", ".join(f"step {s} {seconds(t)}" for s, t in result.overhead.items()))
    whole = [c for c in result.captures if c.time_from == "capture" and c.roles]
    if whole:
        out.append(f"{len(whole)} capture(s) hold no range of their role (not written by profctx's torch backend): "
                   "their role time is the capture's start to stop")
    trend_rows = []
    for role in result.roles:
        values = result.trend(role)
        if len(values) >= 2:
            (s0, t0), (s1, t1) = values[0], values[-1]
            trend_rows.append([role, f"{s0}->{s1}", seconds(t0), seconds(t1), _pct((t1 - t0) / t0 if t0 else None)])
    if trend_rows:
        out += ["", style("Trend (first to last step)", "bold"),
                table(["ROLE", "STEPS", "FIRST", "LAST", "CHANGE"], trend_rows, right={2, 3, 4})]
    for role, ops in result.role_ops.items():
        if not ops:
            continue
        out += ["", style(f"Top operators of {role} (self time, all processes and steps)", "bold"),
                table(["OPERATOR", "SELF", "SHARE", "CALLS"],
                      [[o.name, seconds(o.self_s), f"{o.share:.0%}", str(o.count)] for o in ops[:8]],
                      right={1, 2, 3})]
    empty = [c for c in result.captures if c.empty]
    if empty:
        out += ["", style(f"{len(empty)} capture(s) hold no operator: "
                          + ", ".join(f"step {c.record.step} {c.record.role or 'step'} {c.process or c.record.who}"
                                      for c in empty[:5]), "yellow")]
    answers = [(step, a) for step, a in sorted(result.alignment.items()) if len(a.processes) >= 2]
    if answers:
        out += ["", style("Who the others waited for (the processes lined up on one clock)", "bold")]
        out += [f"step {step}: {result.answer(step)}" for step, _ in answers[:20]]
        if len(answers) > 20:
            out.append(f"... and {len(answers) - 20} more steps (--json lists them all)")
    for problem in result.problems[:10]:
        out.append(style(f"problem: {problem}", "red"))
    return "\n".join(out)


def _diff(args: argparse.Namespace, top: int) -> tuple[Diff, str, str, list[str]]:
    if args.steps:
        if args.new is not None:
            raise UsageError("--steps compares two steps of one run: give one folder")
        sa, sb = args.steps
        a = _summarize(args.base, args.run, args, [sa], top=100_000)
        b = _summarize(args.base, args.run, args, [sb], top=100_000)
        if not a.phases or not b.phases:
            missing = sa if not a.phases else sb
            raise UsageError(f"step {missing}: no completed capture in {args.base} (steps: "
                             f"{', '.join(map(str, _steps(args.base, args.run, args)))})")
        la, lb = f"step {sa}", f"step {sb}"
        holes = [hole(a.missing, "capture record")]
    else:
        a = _summarize(args.base, args.base_run, args, top=100_000)
        b = _summarize(args.new or args.base, args.run, args, top=100_000)
        la, lb = f"{args.base} run {a.run}", f"{args.new or args.base} run {b.run}"
        holes = [f"A: {text}" if (text := hole(a.missing, "capture record")) else None,
                 f"B: {text}" if (text := hole(b.missing, "capture record")) else None]
    return diff(a, b, top=top, a_label=la, b_label=lb), la, lb, [h for h in holes if h]


def _steps(folder: str, run: str, args: argparse.Namespace) -> list[int]:
    path = check_folder(folder)
    chosen = None if run == "all" else (latest_run(path) if run == "latest" else run)
    return sorted({s for r in ManifestReader(path, chosen) if r.status == "ok" for s in r.steps})


def render_diff(result: Diff, style: Style) -> str:
    """Return the diff as terminal tables: roles by absolute delta, then each role's operators."""
    out = [style(f"A: {result.a_label}    B: {result.b_label}", "bold"), ""]
    waits = any(r.a_wait_s > 0 or r.b_wait_s > 0 for r in result.roles)
    rows = []
    for r in result.roles:
        rows.append([r.role, seconds(r.a_s), seconds(r.b_s), _signed(r.delta_s), _pct(r.change),
                     *([seconds(r.a_wait_s), seconds(r.b_wait_s)] if waits else [])])
        for n in r.nested:
            rows.append([f"  {n.role}", seconds(n.a_s), seconds(n.b_s), _signed(n.delta_s), _pct(n.change),
                         *(["", ""] if waits else [])])
    out.append(table(["ROLE", "A", "B", "DELTA", "CHANGE", *(["WAIT A", "WAIT B"] if waits else [])], rows,
                     right={1, 2, 3, 4, 5, 6}))
    if waits:
        out.append("(wait: the longest a process waited there for the others, mean per step: not the role's work)")
    for label, named in (("A", result.a_stragglers), ("B", result.b_stragglers)):
        for step, line in list(named.items())[:5]:
            out.append(f"{label} step {step}: {line}")
    for role in result.roles:
        if not role.ops:
            continue
        out += ["", style(f"{role.role}: operators by |delta| (self time per process and step)", "bold"),
                table(["OPERATOR", "A", "B", "DELTA", "CHANGE"],
                      [[o.name, seconds(o.a_s), seconds(o.b_s), _signed(o.delta_s), _pct(o.change)]
                       for o in role.ops], right={1, 2, 3, 4})]
    return "\n".join(out)


def _signed(s: float) -> str:
    text = seconds(abs(s))
    return ("+" if s >= 0 else "-") + text


def run_diff(args: argparse.Namespace) -> int:
    """Print what changed between A and B."""
    if args.ops < 0:
        raise UsageError(f"--ops {args.ops}: must be 0 or more")
    result, _, _, holes = _diff(args, args.ops)
    if args.json:
        json.dump(result.to_json(), sys.stdout, indent=1)
        sys.stdout.write("\n")
        for line in holes:
            print(line, file=sys.stderr)
    else:
        print(render_diff(result, Style(sys.stdout)))
        for line in holes:
            print(f"\n{line}")
    return OK


def run_check(args: argparse.Namespace) -> int:
    """Exit 1 when a role or operator of ``args.dir`` regressed beyond its threshold against the baseline."""
    try:
        thresholds: list[Threshold] = [parse_threshold(t, "role") for t in args.max_slowdown]
        thresholds += [parse_threshold(t, "op") for t in args.max_op_slowdown]
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    if not any(t.kind == "role" for t in thresholds):
        thresholds.append(Threshold("role", "*", 0.10))
    ns = argparse.Namespace(**vars(args))
    ns.base, ns.new, ns.base_run, ns.steps = args.baseline, args.dir, args.baseline_run, None
    result, la, lb, holes = _diff(ns, 100_000)
    for line in holes:
        print(line, file=sys.stderr)
    violations = check(result, thresholds, min_delta_s=args.min_ms / 1000)
    if args.json:
        json.dump({"schema": "profctx.check", "version": 1, "passed": not violations,
                   "violations": [v.to_json() for v in violations], "diff": result.to_json()}, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return FINDINGS if violations else OK
    style = Style(sys.stdout)
    print(render_check(violations, result, la, lb, style))
    return FINDINGS if violations else OK


def render_check(violations: list[Violation], result: Diff, la: str, lb: str, style: Style) -> str:
    """Return the gate's verdict and, on failure, the table of what regressed."""
    if not violations:
        roles = ", ".join(f"{r.role} {_pct(r.change)}" for r in result.roles)
        return style("check passed", "green") + f": {lb} against baseline {la} ({roles or 'no roles'})"
    rows = [[v.kind, v.role, v.name if v.kind == "op" else "", seconds(v.a_s), seconds(v.b_s), _pct(v.change),
             f"{v.threshold.pattern}={v.threshold.max_change:.0%}"] for v in violations]
    head = style(f"check failed: {len(violations)} regression(s)", "red") + f" in {lb} against baseline {la}"
    return head + "\n" + table(["KIND", "ROLE", "OPERATOR", "BASELINE", "NOW", "CHANGE", "LIMIT"], rows,
                               right={3, 4, 5})

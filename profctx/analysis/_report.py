"""Build the HTML report of a run from its summary: where the time of each step goes, and who is slow.

Sections: a timeline on a real time axis (one row per process: worker group and rank, engine
replica, driver), phase shares per step as stacked bars (with each role's time in no operator and,
for traces of device activity, the device time it launched), a processes x (step, role) heat map
with each step's straggler marked, top operators (and device time) per role across processes, and
the capture table. The page
is one self-contained file (inline CSS, SVG and a few lines of JavaScript; nothing is fetched).
"""

from __future__ import annotations

import html
import math
import statistics
from collections import defaultdict
from collections.abc import Collection, Sequence
from typing import Final

from ..manifest import CaptureRecord, drivers, process_names
from . import CaptureSummary, RoleStep, Summary
from ._timeline import html_section

#: 20 colours of high mutual contrast (Kelly's list without white and black), given to roles in order of
#: first appearance, so no two of the first 20 roles share one.
PALETTE: Final = ("#0067a5", "#f38400", "#008856", "#be0032", "#875692", "#f3c300", "#a1caf1", "#848482",
                  "#e68fac", "#c2b280", "#f99379", "#604e97", "#f6a600", "#b3446c", "#dcd300", "#882d17",
                  "#8db600", "#654522", "#e25822", "#2b3d26")
_WIDTH: Final = 1180
_LEFT: Final = 170
_ROW: Final = 18
_TOP: Final = 40
#: Why a driver's step capture holds no operator (shown instead of an "empty trace" warning).
DRIVER_NOTE: Final = "driver: marks the step, its workers hold the work"


def colours(roles: Sequence[str]) -> dict[str, str]:
    """Return a colour per role: distinct for the first 20 roles, in the order given."""
    return {role: PALETTE[i % len(PALETTE)] for i, role in enumerate(dict.fromkeys(roles))}


def render(summary: Summary, records: Sequence[CaptureRecord], *, damaged: Sequence[str] = (),
           driver: Collection[tuple[str, ...]] | None = None) -> str:
    """Return the report page of ``summary`` (``records``: every capture listed, whatever its status).

    ``driver``: the driver processes of the run, when ``records`` are filtered
    (see :func:`profctx.manifest.process_names`).
    """
    e = html.escape
    all_roles = list(dict.fromkeys([*summary.roles, *(r.role or "step" for r in records)]))
    palette = colours(all_roles)
    statuses: dict[str, int] = defaultdict(int)
    for record in records:
        statuses[record.status] += 1
    by_capture = {c.record.capture: c for c in [*summary.captures, *summary.engines]}
    leaders = set(driver) if driver is not None else drivers(records)
    # A driver's step capture holds no operator by nature (its workers run the step): said, not flagged.
    marking = {c.record.capture for c in by_capture.values() if c.empty and c.record.process in leaders}
    empty = [c for c in by_capture.values() if c.empty and c.record.capture not in marking]
    runs = sorted({r.run or "-" for r in records})
    names = process_names(records, driver)
    status_text = ", ".join(f'<span class="st-{e(s)}">{n} {e(s)}</span>' for s, n in sorted(statuses.items()))
    parts = [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        f"<title>profctx report: {e(', '.join(runs))}</title><style>{_CSS}</style></head><body>",
        f"<h1>profctx report</h1><p class=meta>run <b>{e(', '.join(runs))}</b> · {e(str(summary.save_path))}</p>",
        f"<p class=meta id=summary>{len(records)} captures ({status_text}) · steps {e(_span(summary.steps))} · "
        f"{len(names)} processes · {_size(sum(r.bytes or 0 for r in records))}</p>",
    ]
    if damaged:
        parts.append(f"<p class=warn>{len(damaged)} manifest line(s) unreadable (a write cut by a crash): "
                     f"{e(', '.join(damaged[:10]))}</p>")
    if statuses.get("failed"):
        parts.append(f"<p class=warn id=failed-note>{statuses['failed']} capture(s) failed: see the table below.</p>")
    if empty:
        parts.append(f"<p class=warn id=empty-note>{len(empty)} capture(s) hold no operator (an empty trace): "
                     + e(", ".join(f"step {_span(c.record.steps)} {c.record.role or 'step'} "
                                   f"{names.get(c.record.process, '')}" for c in empty[:8])) + "</p>")
    if marking:
        parts.append(f"<p class=note id=driver-note>{len(marking)} capture(s) of the driver hold no operator, "
                     "as expected: the driver marks the step, its workers hold the work.</p>")
    for problem in summary.problems[:10]:
        parts.append(f"<p class=warn>{e(problem)}</p>")
    # Every step's time from the always-on timeline (nothing when the run wrote none).
    parts.append(html_section(summary.save_path, runs[0] if len(runs) == 1 and runs[0] != "-" else None))
    parts.append("<h2>Timeline</h2><p class=hint>One row per process (worker group and rank, engine replica, "
                 "driver); bars are captures, coloured by role, on one wall-clock axis; grey bands are steps. "
                 "Hatched red: failed; grey diamond: skipped; dashed: never finished; white with a dot: the "
                 "trace holds no operator; pale: a driver's step, whose operators run in its workers. Hover a "
                 "bar for its details, click it to jump to its row.</p>")
    parts.append(_timeline(records, palette, {c.record.capture for c in empty}, names, marking))
    parts.append(_legend(all_roles, palette))
    parts.append("<h2>Phases per step</h2><p class=hint>Each role's time in the step is that of its slowest "
                 "process (ranks run a role together, the slowest sets the pace); the bar shows each role's share "
                 "of the sum. <i>In no operator</i>: the part of that time in which the slowest process ran no "
                 "operator (host waits, sleeps, Python between operators), which no operator table shows."
                 + (" <i>Device</i>: the time of the device work (kernels, copies) the role launched on that "
                    "process, whenever it ran (a kernel often runs after its role's range has closed)."
                    if _has_device(summary) else "") + "</p>")
    parts.append(_phases(summary, palette))
    parts.append(f"<h2>Processes &times; roles</h2><p class=hint>Time of each process in each role, one cell per "
                 f"step; darker is slower relative to the median of the other processes in that step and role. "
                 f"★ marks the straggler of that step: the process the others waited for, in the role where its "
                 f"lag accrued (its work there over the other processes' median by more than "
                 f"{summary.straggler_ratio:.2f}&times;); a cell's wait for the others is in its tooltip and is "
                 f"not work.</p>")
    parts.append(_heatmap(summary))
    parts.append(_answers(summary))
    parts.append("<h2>Top operators per role</h2><p class=hint>Self time (time in the operator itself, not in "
                 "operators it called), summed over every process and step of the role; share of the role's "
                 "total self time. Operators of a thread that draws no role of its own (a collective's, a "
                 "backward's) count in the role another thread of their process was in when they started."
                 + (" <i>Device</i>: the device time the role launched, summed likewise; in the <i>step</i> "
                    "block, what was launched in no role." if summary.role_device else "") + "</p>")
    parts.append(_role_ops(summary, palette))
    parts.append('<h2>Captures</h2><p class=hint>duration: from the capture\'s start to its stop, as the manifest '
                 'records it. blocked: how long the training thread waited for the profiler to stop (the files are '
                 'written afterwards, in the background). size: bytes of the files written.</p>'
                 '<input id=filter placeholder="filter: step, role, rank, status…" aria-label=filter>'
                 "<table id=captures><thead><tr><th>step</th><th>role</th><th>process</th><th>source</th>"
                 "<th>status</th><th>duration</th><th>blocked</th><th>size</th><th>details</th></tr></thead><tbody>")
    for record in records:
        parts.append(_row(record, by_capture.get(record.capture), palette, names[record.process],
                          record.capture in marking))
    parts.append("</tbody></table>")
    parts.append(f"<script>{_JS}</script></body></html>")
    return "".join(parts)


def _identity(key: tuple[str, ...]) -> str:
    """Return who a timeline row is, from its process key (:attr:`CaptureRecord.process`)."""
    if key[0] == "engine":
        return f"{key[1]} replica {key[2]}, run {key[3]}"
    _, host, pid, group, rank, run = key
    return f"host {host}, pid {pid}" + (f", group {group}" if group else "") + f", rank {rank}, run {run}"


def _ticks(span: float) -> float:
    raw = span / 8
    power = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    return next((power * m for m in (1, 2, 5, 10) if power * m >= raw), power * 10)


def _timeline(records: Sequence[CaptureRecord], palette: dict[str, str], empty: set[str],
              names: dict[tuple[str, ...], str], marking: set[str]) -> str:
    timed = [r for r in records if r.begin and math.isfinite(r.begin) and math.isfinite(r.end_time or r.begin)]
    if not timed:
        return "<p class=note>no captures with a time</p>"
    rows = names
    keys = list(rows)
    # Room for the longest row name (about 7 px a character at the label's 12 px font).
    left = min(max(_LEFT, 16 + 7 * max(len(name) for name in rows.values())), 420)
    t0 = min(r.begin for r in timed)
    # At least a millisecond (even where times are too large for a millisecond to change them),
    # and finite (two finite times can be further apart than a float holds).
    span = min(max(max((r.end_time or r.begin) for r in timed) - t0, 1e-3), 1e300)
    scale = (_WIDTH - left - 20) / span
    # Lanes: captures of one process that overlap in time (threads of one worker) stack.
    lanes: dict[str, int] = {}
    lane_count: dict[tuple[str, ...], int] = defaultdict(lambda: 1)
    ends: dict[tuple[str, ...], list[float]] = defaultdict(list)
    for record in sorted(timed, key=lambda r: r.begin):
        slots = ends[record.process]
        lane = next((i for i, end in enumerate(slots) if end <= record.begin), len(slots))
        if lane == len(slots):
            slots.append(0.0)
        slots[lane] = max(record.end_time or record.begin, record.begin + 1e-9)
        lanes[record.capture] = lane
        lane_count[record.process] = max(lane_count[record.process], lane + 1)
    row_y: dict[tuple[str, ...], float] = {}
    y: float = _TOP
    for key in keys:
        row_y[key] = y
        y += lane_count[key] * _ROW + 4
    height = int(y + 8)
    e = html.escape
    svg = [f'<div class=scroll><svg id=timeline xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" '
           f'height="{height}" viewBox="0 0 {_WIDTH} {height}" role=img aria-label="capture timeline">',
           '<defs><pattern id=hatch width=6 height=6 patternUnits=userSpaceOnUse patternTransform="rotate(45)">'
           '<rect width=6 height=6 fill="#fdd"/><line x1=0 y1=0 x2=0 y2=6 stroke="#d33" stroke-width=3/>'
           "</pattern></defs>"]
    # Step bands.
    steps: dict[int, list[float]] = {}
    for r in timed:
        for s in r.steps:
            band = steps.setdefault(s, [r.begin, r.end_time or r.begin])
            band[0], band[1] = min(band[0], r.begin), max(band[1], r.end_time or r.begin)
    for s, (a, b) in sorted(steps.items()):
        x = left + (a - t0) * scale
        w = max((b - a) * scale, 2.0)
        svg.append(f'<g class=stepband data-step="{s}"><rect x="{x:.1f}" y="{_TOP - 16}" width="{w:.1f}" '
                   f'height="{height - _TOP + 12}" fill="#f2f2f5"/><text x="{x + 2:.1f}" y="{_TOP - 5}" '
                   f'class=steplabel>step {s}</text></g>')
    # Axis.
    tick = _ticks(span)
    svg.append(f'<g class=axis><line x1="{left}" y1="{height - 4}" x2="{_WIDTH - 20}" y2="{height - 4}" '
               f'stroke="#999"/>')
    k = 0
    while k * tick <= span + 1e-12:
        x = left + k * tick * scale
        svg.append(f'<line x1="{x:.1f}" y1="{_TOP - 20}" x2="{x:.1f}" y2="{height - 4}" stroke="#e3e3e8"/>'
                   f'<text x="{x:.1f}" y="12" text-anchor=middle class=tick>{_secs(k * tick)}</text>')
        k += 1
    svg.append("</g>")
    for key in keys:
        # The name says group and rank; hovering it gives the process behind it.
        svg.append(f"<g class=rowhead><title>{e(_identity(key))}</title>"
                   f'<text class=rowlabel x="{left - 8}" y="{row_y[key] + _ROW - 5}" text-anchor=end>'
                   f"{e(rows[key])}</text></g>")
    for record in timed:
        by = row_y[record.process] + lanes[record.capture] * _ROW
        bx = left + (record.begin - t0) * scale
        bw = max(((record.end_time or record.begin) - record.begin) * scale, 3.0)
        role = record.role or "step"
        tip = (f"step {_span(record.steps)} · {role} · {rows[record.process]} · {record.status} · "
               f"{_secs(record.duration_s)}")
        if record.reason or record.error:
            tip += f" · {record.reason or record.error}"
        cid = e(record.capture)
        href = f"#c-{cid}"
        if record.status == "skipped" or not record.start_time:
            cx, cy = bx, by + _ROW / 2 - 1
            svg.append(f'<a href="{href}"><path class="bar st-{e(record.status)}" data-capture="{cid}" '
                       f'd="M{cx:.1f} {cy - 6:.1f}l6 6l-6 6l-6 -6z"><title>{e(tip)}</title></path></a>')
            continue
        fill = "url(#hatch)" if record.status == "failed" else palette.get(role, "#999")
        extra = ""
        if record.capture in empty:
            fill, extra = "#fff", " empty"
            tip += " · the trace holds no operator"
        elif record.capture in marking:
            fill, extra = "#eef0f4", " marker"
            tip += f" · {DRIVER_NOTE}"
        svg.append(f'<a href="{href}"><rect class="bar st-{e(record.status)}{extra}" data-capture="{cid}" '
                   f'data-role="{e(role)}" x="{bx:.1f}" y="{by:.1f}" width="{bw:.1f}" height="{_ROW - 4}" '
                   f'fill="{fill}"><title>{e(tip)}</title></rect></a>')
        if extra == " empty":
            svg.append(f'<circle cx="{bx + bw / 2:.1f}" cy="{by + (_ROW - 4) / 2:.1f}" r="2.5" fill="#b00"/>')
    svg.append("</svg></div>")
    return "".join(svg)


def _legend(roles: Sequence[str], palette: dict[str, str]) -> str:
    items = "".join(f'<span data-role="{html.escape(r)}"><i class=sw style="background:{palette[r]}"></i>'
                    f"{html.escape(r)}</span>" for r in roles)
    return (f"<p class=legend id=legend>{items}<span><i class='sw failed'></i>failed</span>"
            "<span><i class='sw skipped'></i>skipped</span><span><i class='sw empty'></i>empty trace</span></p>")


def _has_device(summary: Summary) -> bool:
    """Whether some role's figures hold device time (the traces hold device events)."""
    return any(_device(p) is not None for p in summary.phases)


def _phases(summary: Summary, palette: dict[str, str]) -> str:
    if not summary.phases:
        return "<p class=note>no completed single-step captures: nothing to break down</p>"
    e = html.escape
    device = _has_device(summary)
    out = ["<table id=phases class=phases><thead><tr><th>step</th><th>wall</th><th>roles (share of the step)</th>"
           f"<th>in no operator</th>{'<th>device</th>' if device else ''}</tr></thead><tbody>"]
    for step in summary.steps:
        items = sorted((p for p in summary.phases if p.step == step), key=lambda p: summary.roles.index(p.role)
                       if p.role in summary.roles else 99)
        if not items:
            continue
        segs = "".join(
            f'<span class=seg data-role="{e(p.role)}" style="width:{p.share * 100:.2f}%;background:'
            f'{palette.get(p.role, "#999")}" title="{e(p.role)}: {_secs(p.time_s)} ({p.share:.0%})">'
            f"{e(p.role) if p.share > 0.12 else ''} {f'{p.share:.0%}' if p.share > 0.06 else ''}</span>"
            for p in items)
        idle = "".join(
            f'<div class=noop data-role="{e(p.role)}" data-seconds="{no_op:.6f}">{e(p.role)}: {_secs(no_op)}'
            f"{f' ({no_op / p.time_s:.0%})' if p.time_s > 0 else ''}</div>"
            for p in items if (no_op := _no_op(p)) is not None)
        launched = "".join(
            f'<div class=device data-role="{e(p.role)}" data-seconds="{seconds:.6f}">{e(p.role)}: {_secs(seconds)}'
            "</div>" for p in items if (seconds := _device(p)) is not None)
        cell = f"<td>{launched or '-'}</td>" if device else ""
        inner = "".join(
            f'<div class=nested data-role="{e(p.role)}">{e(p.role)}: '
            + ", ".join(f"{e(child)} {_secs(t)}" for child, t in sorted(p.nested.items(), key=lambda kv: -kv[1]))
            + f", rest {_secs(max(p.time_s - sum(p.nested.values()), 0.0))}</div>"
            for p in items if getattr(p, "nested", None))
        waits = "".join(f'<div class=wait data-role="{e(p.role)}">{e(p.role)}: {_secs(p.wait_s)} waiting for the '
                        f"others (not work)</div>" for p in items if getattr(p, "wait", None) and p.wait_s > 0)
        out.append(f'<tr data-step="{step}"><td>{step}</td><td>{_secs(summary.step_wall.get(step))}</td>'
                   f"<td><div class=stack>{segs}</div>{inner}{waits}</td><td>{idle or '-'}</td>{cell}</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _no_op(phase: RoleStep) -> float | None:
    """Return the seconds of ``phase`` on its slowest process in which no operator ran, when known."""
    value = getattr(phase, "no_op_s", None)
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) and value >= 0 else None


def _device(phase: RoleStep) -> float | None:
    """Return the seconds of device work ``phase`` launched on its slowest process, when its traces hold some."""
    value = getattr(phase, "device_s", None)
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) and value >= 0 else None


def _answers(summary: Summary) -> str:
    """Return the list of who the others waited for, per step lined up (``""`` with one process)."""
    lined = [(step, a) for step, a in sorted(summary.alignment.items()) if len(a.processes) >= 2]
    if not lined:
        return ""
    e = html.escape
    items = "".join(f"<li>step {step}: {e(summary.answer(step) or '')}</li>" for step, _ in lined[:200])
    return ("<h2 id=waited>Who the others waited for</h2><p class=hint>The processes of each step lined up on one "
            "clock (the step timelines' entries and the traces' collectives): the straggler, the segment where its "
            f"lag accrued, and the others' waits (docs/analysis.md).</p><ul class=answers>{items}</ul>")


def _heatmap(summary: Summary) -> str:
    """Return the processes x (step, role) table: one cell per step, starred where that step's straggler is."""
    if not summary.phases:
        return "<p class=note>no data</p>"
    e = html.escape
    roles = [r for r in summary.roles if any(p.role == r for p in summary.phases)]
    by_key = {(p.step, p.role): p for p in summary.phases}
    steps = [s for s in summary.steps if any((s, r) in by_key for r in roles)]
    columns = [(s, r) for s in steps for r in roles if (s, r) in by_key]
    processes = [w for w in summary.processes if any(w in by_key[c].per_process for c in columns)]
    head = "".join(f'<th colspan="{sum(1 for c in columns if c[0] == s)}" class=stephead>step {s}</th>'
                   for s in steps)
    sub = "".join(f"<th>{e(r)}</th>" for _, r in columns)
    out = ["<div class=scroll><table id=heatmap class=heat><thead>"
           f"<tr><th rowspan=2>process</th>{head}</tr><tr>{sub}</tr></thead><tbody>"]
    for who in processes:
        cells = []
        for step, role in columns:
            phase = by_key[(step, role)]
            t = phase.per_process.get(who)
            if t is None:
                cells.append(f'<td class=none data-step="{step}">-</td>')
                continue
            others = [v for k, v in phase.per_process.items() if k != who]
            base = statistics.median(others) if others else t
            rel = t / base if base > 0 else 1.0
            alpha = max(0.05, min(0.85, 0.25 + (rel - 1.0) * 1.2))
            star = phase.straggler == who
            cells.append(f'<td class="cell{" straggler" if star else ""}" data-process="{e(who)}" '
                         f'data-role="{e(role)}" data-step="{step}" style="background:rgba(190,0,50,{alpha:.2f})" '
                         f'title="{e(who)} · step {step} · {e(role)}: {_secs(t)}, {rel:.2f}&times; the median '
                         f'of the other processes{_waited(phase, who)}">{_secs(t)}{" ★" if star else ""}</td>')
        out.append(f"<tr><th>{e(who)}</th>{''.join(cells)}</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


def _waited(phase: RoleStep, who: str) -> str:
    wait = phase.wait.get(who, 0.0) if isinstance(getattr(phase, "wait", None), dict) else 0.0
    return f"; of which {_secs(wait)} waiting for the others" if wait > 0 else ""


def _role_ops(summary: Summary, palette: dict[str, str]) -> str:
    e = html.escape
    blocks = []
    launched = summary.role_device
    for role in dict.fromkeys([*summary.role_ops, *launched]):
        ops = summary.role_ops.get(role, [])
        if not ops and role not in launched:
            continue
        device = (f'<p class=device-total data-role="{e(role)}" data-seconds="{launched[role]:.6f}">device: '
                  f"{_secs(launched[role])}</p>" if role in launched else "")
        rows = "".join(f"<tr><td>{e(o.name)}</td><td>{o.self_s * 1000:.3f}</td><td>{o.share:.1%}</td>"
                       f"<td>{o.count}</td></tr>" for o in ops[:10])
        table = (f"<table class=ops><thead><tr><th>operator</th><th>self ms</th><th>share</th><th>calls</th></tr>"
                 f"</thead><tbody>{rows}</tbody></table>" if ops else "")
        blocks.append(f'<div class=opsblock data-role="{e(role)}"><h3><i class=sw style="background:'
                      f'{palette.get(role, "#999")}"></i>{e(role)}</h3>{device}{table}</div>')
    return f"<div id=roleops class=opsgrid>{''.join(blocks)}</div>" if blocks else "<p class=note>no operators</p>"


def _row(record: CaptureRecord, figures: CaptureSummary | None, palette: dict[str, str], who: str,
         marks: bool = False) -> str:
    e = html.escape
    role = record.role or "step"
    source = f"{record.engine} {record.version or ''}".strip() if record.is_engine else (record.backend or "-")
    detail: list[str] = []
    if record.reason:
        detail.append(f"<div class=reason>{e(record.reason)}</div>")
    if record.error:
        detail.append(f"<div class=err>{e(record.error)}</div>")
    for note in record.notes:
        detail.append(f"<div class=note>{e(note)}</div>")
    for entry in record.files:
        detail.append(f"<div class=file>{e(entry.path)} ({_size(entry.bytes)})</div>")
    if figures is not None:
        for problem in figures.problems:
            detail.append(f"<div class=err>cannot read all of the trace: {e(problem)}</div>")
        if marks:
            detail.append(f"<div class=note>{DRIVER_NOTE}</div>")
        elif figures.empty:
            detail.append("<div class=err>the trace holds no operator</div>")
        if figures.ops:
            rows = "".join(f"<tr><td>{e(o.name)}</td><td>{o.self_s * 1000:.3f}</td><td>{o.total_s * 1000:.3f}</td>"
                           f"<td>{o.count}</td></tr>" for o in figures.ops[:10])
            detail.append("<details><summary>top operations by self time</summary><table class=ops><thead><tr>"
                          "<th>operation</th><th>self ms</th><th>total ms</th><th>calls</th></tr></thead>"
                          f"<tbody>{rows}</tbody></table></details>")
    status = e(record.status)
    return (
        f'<tr id="c-{e(record.capture)}" class="st-{status}">'
        f'<td>{e(_span(record.steps))}</td><td><i class=sw style="background:{palette.get(role, "#999")}"></i>'
        f"{e(role)}</td><td>{e(who)}</td><td>{e(source)}</td><td class=status>{status}</td>"
        f"<td>{_secs(record.duration_s)}</td><td>{_secs(record.blocked_s)}</td>"
        f"<td>{_size(record.bytes) if record.files else '-'}</td><td>{''.join(detail)}</td></tr>"
    )


def _span(values: Sequence[int]) -> str:
    values = list(values)
    if not values:
        return "-"
    return str(values[0]) if len(values) == 1 else f"{values[0]}-{values[-1]}"


def _size(n: float | None) -> str:
    if n is None:
        return "-"
    if n < 1000:
        return f"{n:.0f} B"
    exponent = min(int(math.log(n, 1000)), 4)
    return f"{n / 1000 ** exponent:.1f} {('B', 'kB', 'MB', 'GB', 'TB')[exponent]}"


def _secs(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    return f"{s * 1000:.3g} ms" if s < 1 else f"{s:.3g} s"


_CSS: Final = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:26px 0 4px}h3{font-size:14px;margin:4px 0}
.meta{color:#555;margin:2px 0}.hint{color:#666;font-size:12px;margin:2px 0 8px;max-width:1100px}
.warn,.err{color:#b00}.reason{color:#8a6d00}.note{color:#777}.file{color:#444;font-family:monospace;font-size:12px}
.scroll{overflow-x:auto;border:1px solid #ddd;padding:4px}
.steplabel{font-weight:600;font-size:11px;fill:#555}.tick{font-size:10px;fill:#777}
.rowlabel{font-size:12px;fill:#333}.bar{stroke:#0004}.bar.st-failed{stroke:#d33;stroke-width:1.5}
path.bar{fill:#bbb;stroke:#666}.bar.st-open{stroke:#36c;stroke-dasharray:3 2;stroke-width:1.5}
.bar.empty{stroke:#b00;stroke-dasharray:2 2}
.legend span{margin-right:14px;font-size:12px;white-space:nowrap}
.sw{display:inline-block;width:11px;height:11px;margin-right:4px;vertical-align:-1px;border-radius:2px}
.sw.failed{background:repeating-linear-gradient(45deg,#fdd 0 3px,#d33 3px 5px)}.sw.skipped{background:#bbb}
.sw.empty{background:#fff;border:1px dashed #b00;box-sizing:border-box}
table{border-collapse:collapse;margin-top:6px}th,td{border-bottom:1px solid #eee;padding:3px 8px;text-align:left;
vertical-align:top}th{background:#f3f3f6;font-weight:600}
.phases td:nth-child(3){width:900px}.stack{display:flex;height:20px;border-radius:3px;overflow:hidden}
.seg{color:#fff;font-size:11px;line-height:20px;padding-left:4px;white-space:nowrap;overflow:hidden;
text-shadow:0 0 2px #000}
.heat th.stephead{text-align:center;border-left:2px solid #fff}.noop,.device{font-size:12px;white-space:nowrap}
.device-total{font-size:12px;color:#555;margin:2px 0}
.bar.marker{stroke:#99a;stroke-dasharray:1 2}
.heat td{text-align:right;font-variant-numeric:tabular-nums;color:#111}.heat td.straggler{font-weight:700;
outline:2px solid #be0032;outline-offset:-2px}
.opsgrid{display:flex;flex-wrap:wrap;gap:18px}.opsblock{min-width:300px}
#captures>tbody>tr:target{background:#fff6cc}
.st-failed .status,.st-failed{color:#b00}.st-skipped .status{color:#888}.st-ok .status{color:#287d3c}
.ops{font-size:12px}.ops td:nth-child(n+2){text-align:right;font-variant-numeric:tabular-nums}
#filter{margin:4px 0;padding:3px 6px;width:280px}
"""

_JS: Final = """
(function(){var box=document.getElementById('filter'),rows=document.querySelectorAll('#captures>tbody>tr');
box.addEventListener('input',function(){var q=box.value.toLowerCase();rows.forEach(function(r){
r.style.display=r.textContent.toLowerCase().indexOf(q)<0?'none':'';});});
document.body.setAttribute('data-ready',String(rows.length));})();
"""

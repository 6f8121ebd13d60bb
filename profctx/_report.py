"""Build the HTML report of a run: a timeline of captures and, per capture, its top operations.

The page is one self-contained file (inline CSS, SVG and a few lines of JavaScript; nothing is
fetched), so it can be attached to a ticket or opened from a cluster's shared disk.
"""

from __future__ import annotations

import html
import math
import zlib
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from ._tracejson import EVENTS, TraceFormatError, TraceStream, is_trace_file

#: Categories that are not operations: torch's whole-capture span.
_NOT_OPS: Final = frozenset({"Trace"})
_PALETTE: Final = ("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#ff9da7", "#9c755f",
                   "#bab0ac", "#86bcb6")
_PANEL_W: Final = 240
_LANE_H: Final = 16
_ROW_GAP: Final = 6
_LEFT: Final = 130
_TOP: Final = 34


@dataclass(frozen=True)
class Op:
    """One operation name's totals in a trace; times in microseconds."""

    name: str
    self_us: float
    total_us: float
    count: int


def top_ops(path: Path, limit: int = 10) -> list[Op]:
    """Return the ``limit`` operations of a Chrome trace with the most self time.

    Self time is an event's duration minus that of the events nested directly in it on the same
    thread. Reads the file as a stream but keeps ``(ts, dur, name)`` of every complete event.
    Raise :class:`~profctx._tracejson.TraceFormatError` or ``OSError`` on an unreadable file.
    """
    threads: dict[tuple[str, str], list[tuple[float, float, str]]] = defaultdict(list)
    with TraceStream(path) as stream:
        for key, event in stream.items():
            if key != EVENTS or not isinstance(event, dict) or event.get("ph") != "X":
                continue
            if event.get("cat") in _NOT_OPS:
                continue
            ts, dur = event.get("ts"), event.get("dur")
            if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)):
                continue
            threads[(str(event.get("pid")), str(event.get("tid")))].append((ts, dur, str(event.get("name"))))
    self_time: dict[str, float] = defaultdict(float)
    total: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for events in threads.values():
        events.sort(key=lambda e: (e[0], -e[1]))
        stack: list[list[Any]] = []  # [end, name, child_us]
        for ts, dur, name in events:
            while stack and stack[-1][0] <= ts:
                _end, done, child = stack.pop()
                self_time[done] -= child
            if stack:
                stack[-1][2] += dur
            stack.append([ts + dur, name, 0.0])
            self_time[name] += dur
            total[name] += dur
            count[name] += 1
        for _end, done, child in stack:
            self_time[done] -= child
    ranked = sorted(self_time, key=lambda n: -self_time[n])[:limit]
    return [Op(n, max(self_time[n], 0.0), total[n], count[n]) for n in ranked]


def colour(role: str) -> str:
    """Return a stable colour for a role name."""
    return _PALETTE[zlib.crc32(role.encode()) % len(_PALETTE)]


def render(
    save_path: Path,
    records: Sequence[Mapping[str, Any]],
    *,
    damaged: Sequence[str] = (),
    ops: int = 10,
    max_trace_bytes: int = 200_000_000,
) -> str:
    """Return the report page for ``records`` (the merged manifest of ``save_path``).

    ``ops``: operations listed per capture (0 reads no trace). Traces larger than
    ``max_trace_bytes`` on disk are not read; the page says so.
    """
    e = html.escape
    statuses: dict[str, int] = defaultdict(int)
    for record in records:
        statuses[str(record.get("status"))] += 1
    runs = sorted({str(r.get("run")) for r in records})
    ranks = sorted({int(r["rank"]) for r in records if isinstance(r.get("rank"), int)})
    steps = sorted({s for r in records for s in (r.get("steps") or [])})
    total_bytes = sum(int(r.get("bytes") or 0) for r in records)
    summary = ", ".join(f'<span class="st-{e(s)}">{n} {e(s)}</span>' for s, n in sorted(statuses.items()))
    parts = [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        f"<title>profctx report: {e(', '.join(runs))}</title><style>{_CSS}</style></head><body>",
        f"<h1>profctx report</h1><p class=meta>run <b>{e(', '.join(runs))}</b> · {e(str(save_path))}</p>",
        f'<p class=meta id=summary>{len(records)} captures ({summary}) · steps {e(_span(steps))} · '
        f"ranks {e(_span(ranks))} · {_size(total_bytes)}</p>",
    ]
    if damaged:
        parts.append(f"<p class=warn>{len(damaged)} manifest line(s) unreadable (a write cut by a crash): "
                     f"{e(', '.join(damaged[:10]))}</p>")
    parts.append("<h2>Timeline</h2><p class=hint>One panel per step, each on its own time scale; one row per "
                 "rank or engine replica; bars are captures coloured by role. Hatched red: failed; grey "
                 "diamond: skipped. Click a bar for its details.</p>")
    parts.append(_timeline(records))
    parts.append(_legend(records))
    parts.append('<h2>Captures</h2><input id=filter placeholder="filter: step, role, rank, status…" '
                 'aria-label=filter><table id=captures><thead><tr><th>step</th><th>role</th><th>rank</th>'
                 "<th>source</th><th>status</th><th>duration</th><th>blocked</th><th>size</th><th>details</th>"
                 "</tr></thead><tbody>")
    for record in records:
        parts.append(_row(save_path, record, ops, max_trace_bytes))
    parts.append("</tbody></table>")
    parts.append(f"<script>{_JS}</script></body></html>")
    return "".join(parts)


def _row(save_path: Path, record: Mapping[str, Any], ops: int, max_bytes: int) -> str:
    e = html.escape
    status = str(record.get("status"))
    role = str(record.get("role") or "step")
    steps = record.get("steps") or []
    who = f"{record.get('engine')} r{record.get('replica')}" if record.get("kind") == "engine" \
        else str(record.get("rank"))
    source = f"{record.get('engine')} {record.get('version') or ''}".strip() if record.get("kind") == "engine" \
        else str(record.get("backend") or "-")
    detail: list[str] = []
    if record.get("reason"):
        detail.append(f"<div class=reason>{e(str(record['reason']))}</div>")
    if record.get("error"):
        detail.append(f"<div class=err>{e(str(record['error']))}</div>")
    for note in record.get("notes") or ():
        detail.append(f"<div class=note>{e(str(note))}</div>")
    for entry in record.get("files") or ():
        rel = str(entry.get("path"))
        detail.append(f"<div class=file>{e(rel)} ({_size(entry.get('bytes'))})</div>")
        if ops and is_trace_file(rel):
            detail.append(_ops_table(save_path / rel, ops, max_bytes))
    return (
        f'<tr id="c-{e(str(record.get("capture")))}" class="st-{e(status)}">'
        f"<td>{e(_span(steps))}</td><td><i class=sw style=background:{colour(role.rsplit('/', 1)[-1])}></i>"
        f"{e(role)}</td><td>{e(who)}</td><td>{e(source)}</td><td class=status>{e(status)}</td>"
        f"<td>{_secs(record.get('duration_s'))}</td><td>{_secs(record.get('blocked_s'))}</td>"
        f"<td>{_size(record.get('bytes')) if record.get('files') else '-'}</td>"
        f"<td>{''.join(detail)}</td></tr>"
    )


def _ops_table(path: Path, limit: int, max_bytes: int) -> str:
    e = html.escape
    try:
        if path.stat().st_size > max_bytes:
            return f"<div class=note>not read: larger than {_size(max_bytes)}</div>"
        found = top_ops(path, limit)
    except (OSError, TraceFormatError) as exc:
        return f"<div class=err>cannot read the trace: {e(str(exc))}</div>"
    if not found:
        return "<div class=note>no operations in the trace</div>"
    rows = "".join(
        f"<tr><td>{e(op.name)}</td><td>{op.self_us / 1000:.3f}</td><td>{op.total_us / 1000:.3f}</td>"
        f"<td>{op.count}</td></tr>"
        for op in found
    )
    return ("<details><summary>top operations by self time</summary><table class=ops><thead><tr><th>operation"
            "</th><th>self ms</th><th>total ms</th><th>calls</th></tr></thead><tbody>" + rows + "</tbody></table>"
            "</details>")


def _timeline(records: Sequence[Mapping[str, Any]]) -> str:
    by_step: dict[int, list[Mapping[str, Any]]] = defaultdict(list)
    for record in records:
        steps = record.get("steps") or []
        if steps:
            by_step[int(steps[0])].append(record)
    if not by_step:
        return "<p class=note>no captures with a step</p>"
    row_keys = sorted({_row_key(r) for r in records}, key=lambda k: (k[0], k[1], k[2]))
    # Lanes: captures of one row that overlap in time (several workers of one rank) stack.
    lanes: dict[str, tuple[int, ...]] = {}
    lane_count: dict[tuple[Any, ...], int] = defaultdict(lambda: 1)
    for step, group in by_step.items():
        ends: dict[tuple[Any, ...], list[float]] = defaultdict(list)
        for record in sorted(group, key=_start):
            key = _row_key(record)
            free = [i for i, end in enumerate(ends[key]) if end <= _start(record)]
            lane = free[0] if free else len(ends[key])
            if lane == len(ends[key]):
                ends[key].append(0.0)
            ends[key][lane] = max(_end(record), _start(record) + 1e-9)
            lanes[str(record.get("capture"))] = (step, lane)
            lane_count[key] = max(lane_count[key], lane + 1)
    row_y: dict[tuple[Any, ...], int] = {}
    y = _TOP
    for key in row_keys:
        row_y[key] = y
        y += lane_count[key] * _LANE_H + _ROW_GAP
    width = _LEFT + _PANEL_W * len(by_step) + 10
    height = y + 6
    e = html.escape
    svg = [f'<div class=scroll><svg id=timeline xmlns="http://www.w3.org/2000/svg" width="{width}" '
           f'height="{height}" viewBox="0 0 {width} {height}" role=img aria-label="capture timeline">',
           '<defs><pattern id=hatch width=6 height=6 patternUnits=userSpaceOnUse patternTransform="rotate(45)">'
           '<rect width=6 height=6 fill="#fdd"/><line x1=0 y1=0 x2=0 y2=6 stroke="#d33" stroke-width=3/>'
           "</pattern></defs>"]
    for key in row_keys:
        svg.append(f'<text class=rowlabel x="{_LEFT - 8}" y="{row_y[key] + _LANE_H - 4}" '
                   f'text-anchor=end>{e(key[3])}</text>')
    for column, step in enumerate(sorted(by_step)):
        group = by_step[step]
        x0 = _LEFT + column * _PANEL_W
        t0 = min(_start(r) for r in group)
        t1 = max(max(_end(r) for r in group), t0 + 1e-3)
        scale = (_PANEL_W - 12) / (t1 - t0)
        svg.append(f'<g class=panel data-step="{step}"><rect x="{x0}" y="{_TOP - 4}" width="{_PANEL_W - 4}" '
                   f'height="{height - _TOP}" class="panelbg"/><text x="{x0 + 4}" y="14" class=steplabel>'
                   f'step {step}</text><text x="{x0 + 4}" y="27" class=axis>{_secs(t1 - t0)} shown</text>')
        for record in group:
            key = _row_key(record)
            _, lane = lanes[str(record.get("capture"))]
            by = row_y[key] + lane * _LANE_H
            bx = x0 + 4 + (_start(record) - t0) * scale
            bw = max((_end(record) - _start(record)) * scale, 3.0)
            status = str(record.get("status"))
            role = str(record.get("role") or "step")
            tip = (f"step {_span(record.get('steps') or [])} · {role} · {key[3]} · {status} · "
                   f"{_secs(record.get('duration_s'))}")
            if record.get("reason") or record.get("error"):
                tip += f" · {record.get('reason') or record.get('error')}"
            href = f'#c-{e(str(record.get("capture")))}'
            if status == "skipped" or not record.get("start_time"):
                cx, cy = bx, by + _LANE_H / 2 - 1
                svg.append(f'<a href="{href}"><path class="bar st-{e(status)}" data-capture="'
                           f'{e(str(record.get("capture")))}" d="M{cx:.1f} {cy - 6:.1f}l6 6l-6 6l-6 -6z">'
                           f"<title>{e(tip)}</title></path></a>")
                continue
            fill = "url(#hatch)" if status == "failed" else colour(role.rsplit("/", 1)[-1])
            svg.append(f'<a href="{href}"><rect class="bar st-{e(status)}" data-capture="'
                       f'{e(str(record.get("capture")))}" x="{bx:.1f}" y="{by:.1f}" width="{bw:.1f}" '
                       f'height="{_LANE_H - 3}" fill="{fill}"><title>{e(tip)}</title></rect></a>')
        svg.append("</g>")
    svg.append("</svg></div>")
    return "".join(svg)


def _legend(records: Iterable[Mapping[str, Any]]) -> str:
    roles = sorted({str(r.get("role") or "step").rsplit("/", 1)[-1] for r in records})
    items = "".join(f"<span><i class=sw style=background:{colour(r)}></i>{html.escape(r)}</span>" for r in roles)
    return f"<p class=legend id=legend>{items}<span><i class='sw failed'></i>failed</span>" \
           f"<span><i class='sw skipped'></i>skipped</span></p>"


def _row_key(record: Mapping[str, Any]) -> tuple[int, int, str, str]:
    if record.get("kind") == "engine":
        replica = record.get("replica")
        number = replica if isinstance(replica, int) else 0
        name = str(record.get("engine") or "engine")
        return (1, number, name, f"{name} replica {replica}")
    rank = record.get("rank")
    return (0, rank if isinstance(rank, int) else -1, "", f"rank {rank}")


def _start(record: Mapping[str, Any]) -> float:
    return float(record.get("start_time") or record.get("time") or record.get("end_time") or 0.0)


def _end(record: Mapping[str, Any]) -> float:
    return float(record.get("end_time") or _start(record))


def _span(values: Sequence[Any]) -> str:
    values = list(values)
    if not values:
        return "-"
    return str(values[0]) if len(values) == 1 else f"{values[0]}-{values[-1]}"


def _size(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return "-"
    if n < 1000:
        return f"{n:.0f} B"
    exponent = min(int(math.log(n, 1000)), 4)
    return f"{n / 1000 ** exponent:.1f} {('B', 'kB', 'MB', 'GB', 'TB')[exponent]}"


def _secs(s: Any) -> str:
    if not isinstance(s, (int, float)):
        return "-"
    return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.2f} s"


_CSS: Final = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:24px 0 6px}
.meta{color:#555;margin:2px 0}.hint{color:#777;font-size:12px;margin:2px 0 8px}
.warn,.err{color:#b00}.reason{color:#8a6d00}.note{color:#777}.file{color:#444;font-family:monospace;font-size:12px}
.scroll{overflow-x:auto;border:1px solid #ddd;padding:4px}
.panelbg{fill:#f7f7f9;stroke:#e4e4ea}.steplabel{font-weight:600;font-size:12px}.axis{font-size:10px;fill:#888}
.rowlabel{font-size:12px;fill:#333}.bar{stroke:#0003}.bar.st-failed{stroke:#d33;stroke-width:1.5}
path.bar{fill:#bbb;stroke:#666}.bar.st-open{stroke:#36c;stroke-dasharray:3 2}
.legend span{margin-right:14px;font-size:12px;white-space:nowrap}
.sw{display:inline-block;width:11px;height:11px;margin-right:4px;vertical-align:-1px;border-radius:2px}
.sw.failed{background:repeating-linear-gradient(45deg,#fdd 0 3px,#d33 3px 5px)}.sw.skipped{background:#bbb}
table{border-collapse:collapse;margin-top:6px}th,td{border-bottom:1px solid #eee;padding:3px 8px;text-align:left;
vertical-align:top}th{background:#f3f3f6;font-weight:600}
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

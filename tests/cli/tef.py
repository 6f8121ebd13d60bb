"""A checker for the Trace Event Format (the Chrome/Perfetto JSON trace format).

Required fields per phase follow the format's specification ("Trace Event Format", the
document Chrome's about:tracing and Perfetto's JSON importer implement).
"""

from __future__ import annotations

from typing import Any

_COMMON = ("name", "ph", "pid", "tid")
_REQUIRED: dict[str, tuple[str, ...]] = {
    "X": ("ts", "dur"),
    "B": ("ts",), "E": ("ts",),
    "i": ("ts",), "I": ("ts",),
    "C": ("ts", "args"),
    "b": ("ts", "cat"), "e": ("ts", "cat"), "n": ("ts", "cat"),
    "s": ("ts", "id"), "t": ("ts", "id"), "f": ("ts", "id"),
    "M": ("args",),
}
_METADATA = {"process_name", "process_labels", "process_sort_index", "thread_name", "thread_sort_index"}


def problems(trace: dict[str, Any]) -> list[str]:
    """Return every way ``trace`` breaks the format; empty when it conforms."""
    found: list[str] = []
    events = trace.get("traceEvents")
    if not isinstance(events, list):
        return ["no traceEvents array"]
    named_processes: set[int] = set()
    named_threads: set[tuple[int, int]] = set()
    used: set[tuple[int, int]] = set()
    for i, event in enumerate(events):
        ph = event.get("ph")
        if ph not in _REQUIRED:
            found.append(f"event {i}: unknown phase {ph!r}")
            continue
        for key in (*_COMMON, *_REQUIRED[ph]):
            if key not in event:
                found.append(f"event {i} ({ph} {event.get('name')}): no {key!r}")
        pid, tid = event.get("pid"), event.get("tid")
        if not isinstance(pid, int) or not isinstance(tid, int):
            found.append(f"event {i}: pid/tid not integers: {pid!r}/{tid!r}")
            continue
        if "ts" in event and not isinstance(event["ts"], (int, float)):
            found.append(f"event {i}: ts not a number")
        if ph == "X" and not (isinstance(event.get("dur"), (int, float)) and event["dur"] >= 0):
            found.append(f"event {i}: bad dur {event.get('dur')!r}")
        if ph in ("i", "I") and event.get("s", "t") not in ("g", "p", "t"):
            found.append(f"event {i}: bad instant scope {event.get('s')!r}")
        if ph == "M":
            if event["name"] not in _METADATA:
                found.append(f"event {i}: unknown metadata {event['name']!r}")
            if event["name"] == "process_name":
                named_processes.add(pid)
            if event["name"] == "thread_name":
                named_threads.add((pid, tid))
        else:
            used.add((pid, tid))
    for pid, tid in sorted(used):
        if pid not in named_processes:
            found.append(f"process {pid} has no process_name")
        if (pid, tid) not in named_threads:
            found.append(f"thread {pid}/{tid} has no thread_name")
    return found

"""``profctx report``: a self-contained page, checked in a real headless Chromium."""

from __future__ import annotations

import gzip
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from profctx.analysis import read_figures, summarize
from profctx.analysis._report import PALETTE, colours
from profctx.cli import main


@pytest.fixture(scope="module")
def page(run_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report") / "report.html"
    assert main(["report", str(run_dir), "-o", str(out)]) == 1  # the run holds a failed capture
    return out


def test_report_is_self_contained(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    # Nothing fetched: no external URLs in src/href (the SVG namespace is an identifier, not a fetch).
    assert not re.search(r'(src|href)\s*=\s*["\']?(https?:|//)', text)
    assert "<link" not in text and "@import" not in text
    assert "SessionLostError" in text and "owned by capture" in text
    assert "aten::mm" in text  # top operations read from the traces
    assert len(text) < 200_000


def test_self_time_per_operator_from_a_streamed_trace(tmp_path: Path) -> None:
    trace = tmp_path / "t.json"
    trace.write_text(
        '{"traceEvents":['
        '{"ph":"X","name":"outer","pid":1,"tid":1,"ts":0,"dur":100},'
        '{"ph":"X","name":"leaf","pid":1,"tid":1,"ts":20,"dur":50},'
        '{"ph":"X","name":"inner","pid":1,"tid":1,"ts":10,"dur":70},'
        '{"ph":"X","name":"inner","pid":1,"tid":2,"ts":0,"dur":5},'
        '{"ph":"X","name":"actor_update","cat":"user_annotation","pid":1,"tid":3,"ts":0,"dur":40},'
        '{"ph":"X","name":"mm","cat":"cpu_op","pid":1,"tid":3,"ts":5,"dur":30},'
        '{"ph":"X","name":"sgemm","cat":"kernel","pid":0,"tid":7,"ts":6,"dur":20},'
        '{"ph":"X","name":"PyTorch Profiler (0)","cat":"Trace","pid":1,"tid":3,"ts":0,"dur":999}]}'
    )
    figures = read_figures(trace)
    ops = {name: tuple(v) for (_, _, name), v in figures.ops.items()}
    assert ops["outer"] == (30, 100, 1) and ops["leaf"] == (50, 50, 1) and ops["inner"] == (25, 75, 2)
    assert (None, "actor_update", "mm") in figures.ops  # the operator is filed under its role (no step marker)
    # No list of profctx's ranges: the outermost user range is the role; mm covers 30 of its 40 us.
    assert figures.roles == {(None, "actor_update"): [40, 1, 30]} and "actor_update" not in ops
    assert figures.device == {"sgemm": [20, 1]} and figures.device_us == 20
    assert figures.span_us == 100  # the whole-capture "Trace" span is left out


def test_twenty_roles_get_twenty_distinct_colours() -> None:
    roles = [f"role{i}" for i in range(20)] + ["rollout", "actor_compute_log_prob"]
    palette = colours(roles)
    assert len(set(list(palette.values())[:20])) == 20
    assert colours(["rollout", "actor_compute_log_prob"]) == {"rollout": PALETTE[0],
                                                              "actor_compute_log_prob": PALETTE[1]}


def test_an_empty_capture_is_flagged(run_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    victim = next((copy / "step000001" / "rollout").glob("rank0-*.gz"))
    victim.write_bytes(gzip.compress(b'{"traceEvents": []}'))
    out = tmp_path / "r.html"
    assert main(["report", str(copy), "-o", str(out)]) == 1
    text = out.read_text(encoding="utf-8")
    assert "1 capture(s) hold no operator" in text and 'class="bar st-ok empty"' in text


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(_chromium() is None, reason="chromium is not installed (Debian package 'chromium')")
def test_report_renders_in_headless_chromium(page: Path, run_dir: Path, tmp_path: Path) -> None:
    browser = _chromium()
    assert browser is not None
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--window-size=1300,900"]
    url = page.as_uri()
    shot = tmp_path / "report.png"
    subprocess.run([browser, *flags, f"--user-data-dir={tmp_path / 'p1'}", f"--screenshot={shot}", url],
                   capture_output=True, timeout=120, check=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    dom = subprocess.run([browser, *flags, f"--user-data-dir={tmp_path / 'p2'}", "--dump-dom", url],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    # The script ran: it counts the capture rows.
    assert 'data-ready="9"' in dom
    bars = re.findall(r'class="bar st-(\w+)[^"]*" data-capture="(\w+)"', dom)
    assert len(bars) == 9 and sorted(s for s, _ in bars).count("skipped") == 1
    assert sorted(s for s, _ in bars).count("failed") == 1
    # A real time axis: ticks in ms from 0, and one band per step.
    ticks = re.findall(r'<text [^>]*class="tick">([^<]+)</text>', dom)
    assert ticks[0] == "0 µs" and any(t.endswith(" ms") for t in ticks) and len(ticks) >= 4
    assert 'class="stepband" data-step="1"' in dom and 'class="stepband" data-step="2"' in dom
    # One row per process, never one per bare rank number.
    labels = re.findall(r'<text class="rowlabel"[^>]*>([^<]+)</text>', dom)
    assert labels == ["rank 0", "rank 1"]
    # Phase shares per step: every step's shares add up to the whole bar.
    for step in ("1", "2"):
        row = re.search(rf'<tr data-step="{step}">(.*?)</tr>', dom)
        assert row is not None
        widths = [float(w) for w in re.findall(r"width: ?([0-9.]+)%", row.group(1))]
        assert len(widths) == 2 and abs(sum(widths) - 100) < 0.1
    # Heat map: the cells marked are the stragglers the summary names (which depends on timing here;
    # test_report_marks_the_straggler_of_a_known_run checks a run whose straggler is known).
    stars = set(re.findall(r'class="cell straggler" data-process="([^"]+)" data-role="([^"]+)"', dom))
    assert stars == {(p.straggler, p.role) for p in summarize(run_dir, run=None).stragglers()}
    assert re.search(r'<div class="opsblock" data-role="rollout">.*aten::mm', dom)
    assert dom.count('<tr id="c-') == 9
    assert "blocked: how long the training thread waited" in dom
    # Role colours in the legend are all different.
    legend = re.findall(r'<span data-role="([^"]+)"><i class="sw" style="background: ?(#[0-9a-f]+)', dom)
    assert len(legend) == 3 and len({c for _, c in legend}) == 3


def test_report_marks_the_straggler_of_a_known_run(tmp_path: Path) -> None:
    from analysis.synth import Spec, write_run

    write_run(tmp_path / "run", Spec(steps=(1, 2), ranks=4, slow={(2, "actor_update"): 1.6}))
    out = tmp_path / "r.html"
    assert main(["report", str(tmp_path / "run"), "-o", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    stars = re.findall(r'class="cell straggler" data-process="([^"]+)" data-role="([^"]+)" data-step="(\d+)"', text)
    assert stars == [("actor rank 2", "actor_update", "1"), ("actor rank 2", "actor_update", "2")]  # slow in both
    labels = re.findall(r'<text class=rowlabel[^>]*>([^<]+)</text>', text)
    assert labels == [f"actor rank {r}" for r in range(4)]
    # Shares of step 1: rollout 0.4, ref 0.1, actor_update 0.48 (rank 2's 0.3 x 1.6) of 0.98.
    row = re.search(r'<tr data-step="1">(.*?)</tr>', text)
    assert row is not None
    widths = dict(re.findall(r'data-role="([^"]+)" style="width:([0-9.]+)%', row.group(1)))
    assert abs(float(widths["actor_update"]) - 100 * 0.48 / 0.98) < 0.01


def test_a_run_dated_far_in_the_future_still_gets_a_report(run_dir: Path, tmp_path: Path) -> None:
    """Times so large that a millisecond is below their float resolution (a retyped or damaged
    ``start_time``) still draw a timeline: the span never collapses to zero."""
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    for shard in (copy / ".profctx").glob("*.jsonl"):
        lines = shard.read_text(encoding="utf-8").splitlines()
        shard.write_text("".join(re.sub(r'"(start_time|end_time|time)": ?[0-9.e+]+', r'"\1": 1.76e13', line) + "\n"
                                 for line in lines), encoding="utf-8")
    for index in (copy / ".profctx").glob("*.index"):
        index.unlink()
    out = tmp_path / "r.html"
    assert main(["report", str(copy), "-o", str(out)]) in (0, 1)
    assert "<svg id=timeline" in out.read_text(encoding="utf-8")

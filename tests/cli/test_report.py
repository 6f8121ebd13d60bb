"""``profctx report``: a self-contained page, checked in a real headless Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from profctx._report import top_ops
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


def test_top_ops_ranks_by_self_time(tmp_path: Path) -> None:
    trace = tmp_path / "t.json"
    trace.write_text(
        '{"traceEvents":['
        '{"ph":"X","name":"outer","pid":1,"tid":1,"ts":0,"dur":100},'
        '{"ph":"X","name":"inner","pid":1,"tid":1,"ts":10,"dur":70},'
        '{"ph":"X","name":"leaf","pid":1,"tid":1,"ts":20,"dur":50},'
        '{"ph":"X","name":"inner","pid":1,"tid":2,"ts":0,"dur":5},'
        '{"ph":"X","name":"PyTorch Profiler (0)","cat":"Trace","pid":1,"tid":3,"ts":0,"dur":999}]}'
    )
    ops = {op.name: op for op in top_ops(trace)}
    assert list(ops) == ["leaf", "outer", "inner"]
    assert (ops["outer"].self_us, ops["inner"].self_us, ops["leaf"].self_us) == (30, 25, 50)
    assert (ops["inner"].total_us, ops["inner"].count) == (75, 2)


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(_chromium() is None, reason="chromium is not installed (Debian package 'chromium')")
def test_report_renders_in_headless_chromium(page: Path, tmp_path: Path) -> None:
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
    bars = re.findall(r'class="bar st-(\w+)" data-capture="(\w+)"', dom)
    assert len(bars) == 9 and sorted(s for s, _ in bars).count("skipped") == 1
    assert sorted(s for s, _ in bars).count("failed") == 1
    assert re.search(r'<g class="panel" data-step="1">', dom) and re.search(r'data-step="2"', dom)
    assert dom.count('<tr id="c-') == 9
    assert "rank 0" in dom and "rank 1" in dom

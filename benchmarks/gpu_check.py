"""GPU checks (issue 28), run where ``torch.cuda.is_available()``: what a CUDA run through profctx gives.

Sections (``--only``, comma-separated; all by default), each printing one JSON line tagged with its name:

- ``loop``: a training-shaped CUDA loop (``rollout``: matmuls ending in a ``.item()``; ``actor_update``:
  forward, backward and an optimizer step of an MLP, launched without waiting; ``ref``: matmuls) for steps
  1-4, window 2:4, in step, contiguous and role mode, each into ``--save``/MODE. Around each role the loop
  records CUDA events (the GPU time from the stream reaching the role's start to reaching its end) and
  ``time.perf_counter`` (the role's CPU time), written as JSON lines to ``--save``/MODE/timers.jsonl.
- ``body``: the same loop's steps inside a profctx capture against raw ``torch.profiler`` with CUDA
  activity, alternated; ratio of the medians.
- ``stall``: how long the training thread waits at capture end for a trace of many small kernels: profctx
  (default settings) against ``prof.stop()`` with torch's plain JSON handler; ratio of the medians.
- ``first``: in a fresh process, the first in-window step after ``configure()`` against the next ones.
- ``memory``: a ``torch_memory`` capture; its snapshot is written to ``--save``/memory.

Run: ``python benchmarks/gpu_check.py --save DIR [--only loop,body,stall,first,memory]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import profctx

ROLES = ("rollout", "actor_update", "ref")


class Model(torch.nn.Module):
    """A small MLP whose update is a few dozen kernels."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(4)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.layers(x))


def one_step(model: Model, opt: torch.optim.Optimizer, x: torch.Tensor, timers: list[dict[str, object]] | None,
             step: int) -> None:
    """Run one step's three roles, each in its profctx role block, timing each."""
    for role in ROLES:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        with profctx.profile_step(role=role):
            t0 = time.perf_counter()
            start.record()
            if role == "rollout":
                y = x
                for _ in range(8):
                    y = torch.tanh(y @ x)
                y.sum().item()  # generation waits for its tokens
            elif role == "actor_update":
                opt.zero_grad(set_to_none=True)
                loss = model(x).square().mean()
                loss.backward()
                opt.step()  # launched, not waited for: its kernels run after the block's CPU range
            else:
                with torch.no_grad():
                    model(x).sum()
            end.record()
            cpu = time.perf_counter() - t0
        if timers is not None:
            timers.append({"step": step, "role": role, "cpu_s": cpu, "_events": (start, end)})


def loop(save: Path) -> dict[str, object]:
    """Run the loop once per mode; return what each mode wrote and the timers."""
    torch.manual_seed(0)
    model = Model(2048).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(2048, 2048, device="cuda")
    one_step(model, opt, x, None, 0)  # warm the kernels and the allocator
    torch.cuda.synchronize()
    out: dict[str, object] = {}
    for mode in ("step", "contiguous", "role"):
        folder = save / mode
        profctx.configure(steps="2:4", mode="role" if mode == "role" else "step", contiguous=mode == "contiguous",
                          save_path=str(folder), exit_hooks=False)
        timers: list[dict[str, object]] = []
        for step in range(1, 5):
            with profctx.profile_step(step):
                one_step(model, opt, x, timers, step)
        torch.cuda.synchronize()
        profctx.flush(120)
        profctx.reset()
        for t in timers:
            start, end = t.pop("_events")  # type: ignore[misc]
            t["gpu_s"] = start.elapsed_time(end) / 1e3
        (folder / "timers.jsonl").write_text("".join(json.dumps(t) + "\n" for t in timers))
        out[mode] = {"device_events": _device_events(folder),
                     "timers": [t for t in timers if 2 <= int(t["step"]) <= 4]}  # type: ignore[call-overload]
    return out


def _device_events(folder: Path) -> dict[str, list[int]]:
    """Per trace: how many device events (kernels, copies, sets) it holds, and how many read ts 0."""
    import gzip

    counts = {}
    for path in sorted(folder.rglob("*.pt.trace.json.gz")):
        events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
        device = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
        counts[str(path.relative_to(folder).parent)] = [len(device), sum(1 for e in device if not e.get("ts"))]
    return counts


def body(rounds: int = 7, steps: int = 5) -> dict[str, object]:
    """Capture body: the loop inside a profctx step capture against raw torch.profiler (CPU + CUDA)."""
    model = Model(2048).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(2048, 2048, device="cuda")
    one_step(model, opt, x, None, 0)
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    raw: list[float] = []
    ours: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        profctx.configure(steps=f"1:{rounds + 1}", save_path=tmp, exit_hooks=False, timeline=False)
        for r in range(1, rounds + 1):
            with torch.profiler.profile(activities=acts) as prof:
                t0 = time.perf_counter()
                for _ in range(steps):
                    one_step(model, opt, x, None, 0)
                torch.cuda.synchronize()
                raw.append(time.perf_counter() - t0)
            del prof
            with profctx.profile_step(r):
                t0 = time.perf_counter()
                for _ in range(steps):
                    one_step(model, opt, x, None, 0)
                torch.cuda.synchronize()
                ours.append(time.perf_counter() - t0)
        profctx.flush(120)
        profctx.reset()
    return {"raw_s": statistics.median(raw), "profctx_s": statistics.median(ours),
            "ratio": statistics.median(ours) / statistics.median(raw), "rounds": rounds, "steps_per_round": steps}


def stall(ops: int = 6000, rounds: int = 3) -> dict[str, object]:
    """Capture end: the training thread's wait at the end of a capture of ``ops`` small kernels."""
    x = torch.ones(4, device="cuda")
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    handler: list[float] = []
    ours: list[float] = []
    sizes: list[int] = []
    with tempfile.TemporaryDirectory() as tmp:
        profctx.configure(steps=f"1:{rounds + 1}", save_path=str(Path(tmp) / "p"), exit_hooks=False, timeline=False)
        for r in range(1, rounds + 1):
            prof = torch.profiler.profile(
                activities=acts,
                on_trace_ready=torch.profiler.tensorboard_trace_handler(str(Path(tmp) / f"h{r}"), use_gzip=False))
            prof.start()
            for _ in range(ops):
                x = x.add(1).mul(1)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            prof.stop()
            handler.append(time.perf_counter() - t0)
            sizes.extend(p.stat().st_size for p in (Path(tmp) / f"h{r}").iterdir())
            block = profctx.profile_step(r)
            block.__enter__()
            for _ in range(ops):
                x = x.add(1).mul(1)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            block.__exit__(None, None, None)
            ours.append(time.perf_counter() - t0)
        profctx.flush(120)
        profctx.reset()
    return {"handler_s": statistics.median(handler), "profctx_s": statistics.median(ours),
            "ratio": statistics.median(ours) / statistics.median(handler), "trace_mb": max(sizes) / 1e6,
            "rounds": rounds}


_FIRST = """
import json, sys, tempfile, time, torch, profctx
x = torch.randn(1024, 1024, device="cuda"); (x @ x).sum().item()
with tempfile.TemporaryDirectory() as tmp:
    t0 = time.perf_counter(); profctx.configure(steps="1:4", save_path=tmp, exit_hooks=False)
    configure_s = time.perf_counter() - t0
    times = []
    for step in range(1, 5):
        t0 = time.perf_counter()
        with profctx.profile_step(step), profctx.profile_step(role="work"):
            (x @ x).sum().item()
        times.append(time.perf_counter() - t0)
    profctx.flush(60)
print(json.dumps({"configure_s": configure_s, "steps_s": times}))
"""


def first() -> dict[str, object]:
    """The first profiled steps of a fresh process."""
    done = subprocess.run([sys.executable, "-c", _FIRST], capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        return {"error": done.stderr[-2000:]}
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def memory(save: Path) -> dict[str, object]:
    """A torch_memory capture: the snapshot file and how many allocations it holds."""
    import pickle

    folder = save / "memory"
    profctx.configure(steps=[3], tool="torch_memory", save_path=str(folder), exit_hooks=False)
    with profctx.profile_step(3), profctx.profile_step(role="alloc"):
        kept = [torch.empty(1 << 20, device="cuda") for _ in range(4)]
    profctx.flush(60)
    profctx.reset()
    del kept
    files = sorted(p for p in folder.rglob("*.pickle"))
    if not files:
        return {"error": "no snapshot", "files": sorted(str(p) for p in folder.rglob("*"))}
    snapshot = pickle.loads(files[0].read_bytes())
    allocs = sum(1 for trace in snapshot["device_traces"] for e in trace if e["action"] == "alloc")
    return {"snapshot": str(files[0]), "allocs": allocs}


def compare(save: Path) -> None:
    """Print, per mode, step and role, the summary's range and device times next to the loop's own timers."""
    for mode in ("step", "contiguous", "role"):
        folder = save / mode
        lines = (folder / "timers.jsonl").read_text().splitlines()
        timers = {(t["step"], t["role"]): t for t in map(json.loads, lines)}
        for phase in json.loads((folder / "summary.json").read_text())["phases"]:
            t = timers.get((phase["step"], phase["role"]))
            device = phase.get("device_s")
            if t is None or device is None:
                print(mode, phase["step"], phase["role"], "device_s", device)
                continue
            print(f"{mode:10} step {phase['step']} {phase['role']:13} range {phase['time_s'] * 1e3:7.3f} ms "
                  f"(timer {t['cpu_s'] * 1e3:7.3f})  device {device * 1e3:7.3f} ms "
                  f"(CUDA events {t['gpu_s'] * 1e3:7.3f}, ratio {device / t['gpu_s']:.3f})")


def main() -> None:
    """Run the sections asked for; print one JSON line per section."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--save", required=True)
    parser.add_argument("--only", default="loop,body,stall,first,memory")
    parser.add_argument("--compare", action="store_true", help="compare a finished run's summary.json with its timers")
    args = parser.parse_args()
    if args.compare:
        compare(Path(args.save))
        return
    save = Path(args.save)
    save.mkdir(parents=True, exist_ok=True)
    print(json.dumps({"device": torch.cuda.get_device_name(0), "torch": torch.__version__}), flush=True)
    sections = {"loop": lambda: loop(save), "body": body, "stall": stall, "first": first,
                "memory": lambda: memory(save)}
    for name in args.only.split(","):
        t0 = time.perf_counter()
        try:
            result = sections[name]()
        except Exception as exc:  # one section's failure must not hide the others' figures
            result = {"error": f"{type(exc).__name__}: {exc}"}
        result["section_s"] = time.perf_counter() - t0
        print(json.dumps({name: result}), flush=True)


if __name__ == "__main__":
    main()

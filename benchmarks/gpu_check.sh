#!/usr/bin/env bash
# GPU checks (issue 28) in one go, on a machine with CUDA and torch, from a checkout of profctx.
#
#   bash benchmarks/gpu_check.sh OUT [WHEELS]
#
# WHEELS: a folder of wheels to install first (orjson, msgspec, isal; HTA with plotly, pydot and
# pandas<3 for the HTA breakdowns), into a private target folder. Everything it finds lands in OUT:
# env.txt (device, versions, nsys), check.jsonl (benchmarks/gpu_check.py), analysis.txt (summary,
# report, merge, HTA), nsys.txt, tests.txt, runs.tgz (the run folders, for the analysis tests).
set -u
out=$(realpath "$1")
mkdir -p "$out"
export PYTHONUNBUFFERED=1
root=$(cd "$(dirname "$0")/.." && pwd)
site=/tmp/profctx-site
if [ -n "${2:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$2"/*.whl \
    >"$out/pip.txt" 2>&1
  export PYTHONPATH="$root:$site"
else
  export PYTHONPATH="$root"
fi
cd "$root" || exit 2
runs=/tmp/profctx-gpu
rm -rf "$runs"

{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import sys, torch, numpy; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda, 'numpy', numpy.__version__)"
  python3 -c "import pandas, hta; print('pandas', pandas.__version__, 'hta', getattr(hta, '__version__', '?'))"
  echo "nsys on PATH: $(command -v nsys || echo none)"
  find / -xdev \( -name nsys -o -name 'nsys-*' \) -type f 2>/dev/null | head -5
  nproc
} >"$out/env.txt" 2>&1

timeout 240 python3 benchmarks/gpu_check.py --save "$runs" 2>&1 | tee "$out/check.jsonl"

{
  for mode in step contiguous role; do
    echo "== summary $mode"
    timeout 60 python3 -m profctx summary "$runs/$mode"
    timeout 60 python3 -m profctx summary --json "$runs/$mode" >"$runs/$mode/summary.json"
    echo "rc=$?"
  done
  echo "== device time per role (summary, kernels by correlation) against the CUDA-event timers"
  python3 benchmarks/gpu_check.py --save "$runs" --compare
  echo "== report step"; timeout 60 python3 -m profctx report "$runs/step" -o "$runs/step/report.html"; echo "rc=$?"
  echo "== merge step"; timeout 60 python3 -m profctx merge "$runs/step" -o "$runs/merged.json.gz"; echo "rc=$?"
  python3 - "$runs/merged.json.gz" <<'EOF'
import gzip, json, sys
events = json.loads(gzip.decompress(open(sys.argv[1], "rb").read()))["traceEvents"]
cats = {}
for e in events:
    cats[e.get("cat")] = cats.get(e.get("cat"), 0) + 1
print("merged events", len(events), "kernels", cats.get("kernel", 0), "flows", cats.get("ac2g", 0))
EOF
  echo "== merge --hta step"; timeout 60 python3 -m profctx merge --hta "$runs/step" -o "$runs/hta"; echo "rc=$?"
  timeout 120 python3 - "$runs/hta" <<'EOF'
import json, sys
from pathlib import Path
from hta.trace_analysis import TraceAnalysis
folder = next(p.parent for p in Path(sys.argv[1]).rglob("rank*.pt.trace.json.gz"))
analysis = TraceAnalysis(trace_dir=str(folder), include_last_profiler_step=True)
temporal = analysis.get_temporal_breakdown(visualize=False)
print("temporal", temporal.to_dict(orient="records"))
_, kernels = analysis.get_gpu_kernel_breakdown(visualize=False, num_kernels=5, duration_ratio=1.0)
print("kernels", kernels.head(8).to_dict(orient="records"))
idle = analysis.get_idle_time_breakdown(visualize=False)
print("idle", idle[0].to_dict(orient="records") if isinstance(idle, tuple) else idle)
EOF
  echo "rc=$?"
  echo "== memory viz"
  snap=$(find "$runs/memory" -name '*.pickle' | head -1)
  timeout 60 python3 -m torch.cuda._memory_viz trace_plot "$snap" -o "$runs/memory.html"; echo "rc=$? $(stat -c %s "$runs/memory.html" 2>/dev/null)"
} >"$out/analysis.txt" 2>&1
tar czf "$out/runs.tgz" -C "$runs" --exclude='*.html' . 2>/dev/null

{
  nsys=$(command -v nsys || find / -xdev -name nsys -type f -perm -u+x 2>/dev/null | head -1)
  echo "nsys: ${nsys:-none}"
  if [ -n "$nsys" ]; then
    "$nsys" --version
    PATH="$(dirname "$nsys"):$PATH" timeout 120 python3 -m pytest -q -p no:cacheprovider tests/backends/test_gpu.py -k nsys
    ls -la /tmp/pytest-of-*/pytest-*/test_under_nsys*/ 2>/dev/null
  fi
} >"$out/nsys.txt" 2>&1

nsys=$(command -v nsys || find / -xdev -name nsys -type f -perm -u+x 2>/dev/null | head -1)
PATH="$(dirname "${nsys:-/nonexistent/x}"):$PATH" timeout 150 python3 -m pytest -q -p no:cacheprovider -m "not ray" \
  tests/backends tests/test_torch_backend.py tests/analysis/test_real_traces.py tests/analysis/test_device.py \
  tests/cli/test_hta.py tests/cli/test_hta_layout.py tests/test_steps.py >"$out/tests.txt" 2>&1
tail -5 "$out/tests.txt"
if [ -n "${PROFCTX_GPU_BENCH:-}" ]; then  # the analysis on 2 of the machine's cores, a quiet machine: wall against CPU
  timeout "$PROFCTX_GPU_BENCH" taskset -c 0,1 python3 benchmarks/bench_analysis_real.py --ranks 4 --steps 2 --mb 10 \
    --repeat 2 --bomb-mb 0 >"$out/bench.txt" 2>&1
  tail -25 "$out/bench.txt"
fi
ls -la "$out"

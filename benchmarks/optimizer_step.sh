#!/usr/bin/env bash
# act-ckpt with each optimizer step (issue 43): the default, foreach=true, foreach=false, fused=true, each one quick run,
# measured peak and its phase beside the planner's prediction of exactly that run.
#
#   bash benchmarks/optimizer_step.sh ci          # the ci stand-in on this CPU (peak_tensor_gib), ~5 min on 2 cores
#   bash benchmarks/optimizer_step.sh gpu WHEELS  # the 7B in bf16-true, random weights, on one GPU of >= 80 GB:
#                                                 # WHEELS from `python -m lab_helpers wheelhouse` (docs/measuring-on-a-gpu.md)
# Output: optimizer_step_<profile>.out.txt's table; the records in $OUT/runs.jsonl when OUT is set.
set -uo pipefail
profile="${1:-ci}" wheels="${2:-}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo" || exit 1
python="${LAB_PYTHON:-python3}"
[[ -x .venv/bin/python && $profile == ci ]] && python=.venv/bin/python
t0=$SECONDS
if [[ -n $wheels ]]; then
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$wheels"/*.whl \
        >/tmp/optimizer-step-pip.txt 2>&1 || { tail -3 /tmp/optimizer-step-pip.txt; exit 1; }
    export PYTHONPATH="/tmp/site:$repo"
fi
results="$(mktemp -d "${TMPDIR:-/tmp}/optimizer-step-XXXXXX")"
export LAB_PROFILE="$profile" LAB_RESULTS="$results" PYTHONUNBUFFERED=1
if [[ $profile == gpu ]]; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    "$python" -m lab_helpers prepare --profile gpu --random-weights --models 7b >"$results/prepare.log" 2>&1 ||
        { tail -3 "$results/prepare.log"; exit 1; }
else
    "$python" -m lab_helpers prepare --profile ci >"$results/prepare.log" 2>&1 || { tail -3 "$results/prepare.log"; exit 1; }
fi
"$python" -c "import torch, platform; print('torch', torch.__version__, '|', platform.processor() or platform.machine())"
echo "ready in $((SECONDS - t0)) s"
for set in "" "optimizer.foreach=true" "optimizer.foreach=false" "optimizer.fused=true"; do
    timeout 300 "$python" -m lab_helpers run act-ckpt --quick --quiet ${set:+--set $set} 2>&1 | tail -1
    [[ -n ${OUT:-} && -f $results/runs.jsonl ]] && cp "$results/runs.jsonl" "$OUT/runs.jsonl"
done
grep -h "lab: optimizer" "$results"/runs/*/output.log
"$python" - "$results/runs.jsonl" <<'PY'
import json, sys
print(f"{'act-ckpt with':<26} {'step':<9} {'measured GiB':>13} {'in':<16} {'predicted GiB':>13} {'in':<16} {'error':>8}")
for line in open(sys.argv[1]):
    r = json.loads(line)
    p = r.get("predicted") or {}
    measured = r["peak_alloc_gib"] if r.get("peak_alloc_gib") is not None else r.get("peak_tensor_gib")
    given = ", ".join(f"{k}={v}" for k, v in (r.get("overrides") or {}).items() if k.startswith("optimizer")) or "(default)"
    error = 100 * (measured / r["predicted_peak_alloc_gib"] - 1)
    print(f"{given:<26} {p.get('optimizer_step'):<9} {measured:>13.4f} {r.get('peak_phase') or '?':<16} "
          f"{r['predicted_peak_alloc_gib']:>13.4f} {p.get('peak_phase'):<16} {error:>+7.3f}%")
PY
echo "done in $((SECONDS - t0)) s"

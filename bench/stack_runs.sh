#!/usr/bin/env bash
# Issue 32's check on a lent GPU: torchtitan, DeepSpeed ZeRO-3 and Accelerate run from `planner export`
# files (bench/stacks/, written by bench/stacks/make_inputs.sh) on one GPU, for one call of the
# device machine (nothing to download there: the stacks travel as wheels in .whl, see below).
#
#   bench/stack_runs.sh OUT_DIR RUN...
#
# Runs, in the order given, each under `timeout` of what is left of BUDGET_S (default 480 s; a run
# is skipped, and said so, when fewer than 40 s are left):
#   titan-NAME  (titan-bf16-compile, titan-fp8-compile, titan-bf16-eager, -eager-32k, -compile-32k, -eager-full)
#               torchtitan 0.2.2's trainer (bench/torchtitan_train.py) on bench/stacks/RUN.toml, STEPS
#               steps (default 10) logged one by one; the last step profiled into RUN-kernels.csv
#   deepspeed   bench/stack_train.py --stack deepspeed on bench/stacks/deepspeed-zero3.json
#   accelerate  accelerate launch --config_file bench/stacks/accelerate.yaml bench/stack_train.py
#               (both with one more step profiled into RUN-kernels.csv)
#   sdpa        bench/sdpa_bench.py: SDPA's backends at the runs' attention shapes (sdpa.json)
# Each writes OUT_DIR/RUN.log (and RUN.json for deepspeed and accelerate); OUT_DIR/smi.csv samples the
# GPU's clocks and power once a second throughout. Compare them here with
#   build/planner/planner compare bench/stacks/RUN.plan.json OUT_DIR/RUN.log    (torchtitan)
#   bench/stack_predictions.py build/planner/planner OUT_DIR                     (all of them)
#
# Wheels: .whl/*.whl (torchtitan 0.2.2, torchdata, tyro and its needs, tomli, DeepSpeed 0.19.8 built
# here with DS_BUILD_OPS=0, hjson, pydantic and its needs, torchao) are installed into /tmp/site first.
# Exit: 0 when every run finished, 1 when one failed or was skipped, 2 on bad input.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ $# -ge 2 ] || { sed -n '5,16p' "$0" >&2; exit 2; }
out="$1"; shift
for run in "$@"; do
  case "$run" in deepspeed|accelerate|sdpa) ;;
    titan-*) [ -f "$here/bench/stacks/$run.toml" ] || { echo "stack_runs: no bench/stacks/$run.toml (bench/stacks/make_inputs.sh writes them)" >&2; exit 2; } ;;
    *) echo "stack_runs: unknown run \"$run\" (titan-NAME for bench/stacks/titan-NAME.toml, deepspeed, accelerate, sdpa)" >&2; exit 2 ;;
  esac
done
mkdir -p "$out" || exit 2
out="$(cd "$out" && pwd)"
cd "$here" || exit 2
budget="${BUDGET_S:-480}" steps="${STEPS:-10}" python="${PYTHON:-python3}"
t0=$(date +%s)
left() { echo $(( budget - ($(date +%s) - t0) )); }
note() { echo "$*" | tee -a "$out/summary.txt"; }
status=0

{ git log --oneline -1; git status --short; } > "$out/commit.txt" 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version,power.limit,memory.total --format=csv > "$out/gpu.txt" 2>&1 || true
if ls .whl/*.whl > /dev/null 2>&1; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > "$out/pip.log" 2>&1 ||
    { note "wheels: install failed (pip.log)"; exit 1; }
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PATH="/tmp/site/bin:$PATH"
fi
"$python" - > "$out/versions.txt" 2>&1 <<'EOF'
import importlib
for name in ("torch", "torchtitan", "torchao", "deepspeed", "accelerate", "transformers"):
    try:
        print(name, importlib.import_module(name).__version__)
    except Exception as e:
        print(name, "missing:", e)
EOF
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,memory.used --format=csv,nounits -l 1 > "$out/smi.csv" 2>&1 &
smi=$!
trap 'kill $smi 2>/dev/null' EXIT
export DS_BUILD_OPS=0 MAX_JOBS="$(nproc)" TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"

for run in "$@"; do
  if [ "$(left)" -lt 40 ]; then note "$run: skipped, $(left) s left of BUDGET_S=$budget"; status=1; continue; fi
  s=$(date +%s)
  echo "$run: start at $(( s - t0 )) s" >> "$out/summary.txt"
  case "$run" in
    titan-*)
      KERNELS="$out/$run-kernels.csv" timeout "$(left)" torchrun --standalone --nproc-per-node 1 bench/torchtitan_train.py \
        --job.config_file "bench/stacks/$run.toml" --training.steps "$steps" --metrics.log_freq 1 > "$out/$run.log" 2>&1 ;;
    deepspeed)
      # DeepSpeed's op builder reads TORCH_CUDA_ARCH_LIST as numbers only (builder.py compute_capability_args:
      # int() of each part): a machine's "9.0a" stops its FusedAdam build, so the plain archs are given.
      KERNELS="$out/$run-kernels.csv" TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST//a/}" timeout "$(left)" torchrun --standalone --nproc-per-node 1 bench/stack_train.py --stack deepspeed \
        --deepspeed_config bench/stacks/deepspeed-zero3.json --model bench/stacks/llama3-8b-8l.json --seq-len 8192 \
        --steps "$steps" --out "$out/$run.json" > "$out/$run.log" 2>&1 ;;
    accelerate)
      KERNELS="$out/$run-kernels.csv" timeout "$(left)" accelerate launch --config_file bench/stacks/accelerate.yaml bench/stack_train.py --stack accelerate \
        --micro-batch 1 --global-batch 2 --model bench/stacks/llama3-8b-8l.json --seq-len 8192 \
        --steps "$steps" --out "$out/$run.json" > "$out/$run.log" 2>&1 ;;
    sdpa)
      timeout "$(left)" "$python" bench/sdpa_bench.py "$out/sdpa.json" > "$out/$run.log" 2>&1 ;;
  esac
  rc=$?
  [ $rc -eq 0 ] || status=1
  note "$run: rc $rc in $(( $(date +%s) - s )) s; $(grep -a -E 'step: +[0-9]+|stack_train: .*median' "$out/$run.log" | tail -1 | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-220)"
  [ $rc -eq 0 ] || grep -a -E "Error|error:|Killed|out of memory" "$out/$run.log" | tail -3 | tee -a "$out/summary.txt"
done
exit $status

#!/usr/bin/env bash
# The GPU checks of issue 12 and the fine-tuning bench, chained for one call of a lent GPU machine
# (shared/notes/gpu-runs.md: nothing to download there, so the header-only packages travel in
# .gpudeps; the machine is given back soon after each call, so build and runs go in one command).
#
#   bench/gpu_session.sh OUT_DIR TASK...
#
# Tasks, run in the order given, each writing its logs and JSON into OUT_DIR:
#   tests       the CUDA unit tests: fused ops (kernels against ATen) and fp8 (scaled GEMMs against
#               float32, the cast kernel against ATen), the NCCL engine on one rank (NcclEngine)
#               and Quantize (dequantisation)
#   profile     executor --kernel-profile of Llama 3.2 1B, seq 2048, mb 4, gb 32 (kernels.csv)
#   bench       bench/eager_bench.sh on the same plan against compiled PyTorch (bench.json)
#   exactness   bench/fused_exactness.sh, fused against reference paths over 10 steps
#   finetune:V  bench/finetune_bench.sh, variant V (lora, qlora-nf4, qlora-int8 or lora-offload) on
#               FINETUNE="MODEL SEQ MICRO GLOBAL STEPS" (default Llama 3 8B, 4096, 2, 16, 5)
#   fp8-loss    bench/fp8_loss.sh: Llama 3.2 1B, seq 2048, mb 4, gb 4, 200 steps, bf16 against fp8
#   fp8-speed   bench/eager_bench.sh with PRECISION=fp8 against torchao's float8 under torch.compile
#               (PEERS compile-float8; torchao from .whl when python3 lacks it), then the executor in
#               bf16 on the same plan: FP8_SPEED="MODEL SEQ MICRO GLOBAL STEPS" (default Llama 3.2 3B,
#               4096, 1, 4, 6)
#   hwprofile   planner profile --device cuda --base $CLUSTER: the measured profile of the GPU (about 50 s)
# The build comes first (configured once into BUILD_DIR, then only what changed).
#
# Environment: BUDGET_S (seconds for the whole call, default 540: a task is skipped, and said
# so, when fewer than 40 s are left, and each runs under `timeout` of what is left), BUILD_DIR
# (default build-gpu), DEPS (header-only packages, default .gpudeps/usr), PYTHON (default
# python3), CLUSTER (default dgx-h100), PEERS (bench's peers, default compile).
# Exit: 0 when every task ran and passed, 1 when one failed or was skipped, 2 on bad input.
#
# On the device machine (the tool library's device README), for example:
#   bench/gpu_session.sh $OUT/r tests finetune:qlora-nf4 finetune:qlora-int8; cd $OUT && tar czf r.tgz r
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ $# -ge 2 ] || { sed -n '5,14p' "$0" >&2; exit 2; }
out="$1"; shift
budget="${BUDGET_S:-540}" build="${BUILD_DIR:-build-gpu}" deps="${DEPS:-$here/.gpudeps/usr}"
python="${PYTHON:-python3}" cluster="${CLUSTER:-dgx-h100}" peers="${PEERS:-compile}"
for task in "$@"; do
  case "$task" in
    tests|profile|bench|exactness|finetune:lora|finetune:qlora-nf4|finetune:qlora-int8|finetune:lora-offload|fp8-loss|fp8-speed|hwprofile) ;;
    *) echo "gpu_session: unknown task \"$task\" (tests, profile, bench, exactness, finetune:VARIANT, fp8-loss, fp8-speed, hwprofile)" >&2; exit 2 ;;
  esac
done
mkdir -p "$out" || exit 2
cd "$here" || exit 2
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
t0=$(date +%s)
left() { echo $(( budget - ($(date +%s) - t0) )); }
status=0
note() { echo "$*" | tee -a "$out/summary.txt"; }

{ git log --oneline -1; git status --short; } > "$out/commit.txt" 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm,driver_version,power.limit --format=csv > "$out/gpu.txt" 2>&1 || true

# Build: configure once, then the targets the tasks need.
targets="executor planner" tests=OFF
case " $* " in *" tests "*) targets="$targets trainplan_fused_ops_tests trainplan_finetune_tests" tests=ON ;; esac
if [ ! -f "$build/CMakeCache.txt" ]; then
  prefix=$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)') || { note "build: $python has no torch"; exit 1; }
  configure() {
    cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTRAINPLAN_BUILD_EXECUTOR=ON -DTRAINPLAN_BUILD_GUI=OFF \
      -DTRAINPLAN_BUILD_TESTS="$1" -DTRAINPLAN_BUILD_BENCH=OFF "-DCMAKE_PREFIX_PATH=$prefix;$deps" > "$out/configure.log" 2>&1
  }
  if ! configure "$tests"; then
    tail -20 "$out/configure.log"
    # No GoogleTest there (DEPS can carry libgtest-dev and libgmock-dev): the other tasks still run.
    [ "$tests" = ON ] && configure OFF || { note "build: configure failed (configure.log)"; exit 1; }
    note "build: configured without the tests (configure.log); the tests task will fail"
    tests=OFF targets="executor planner" status=1
  fi
elif [ "$tests" = ON ]; then
  cmake -DTRAINPLAN_BUILD_TESTS=ON "$build" > "$out/configure.log" 2>&1
fi
# shellcheck disable=SC2086  # the targets are words
if ! cmake --build "$build" -j"$(nproc)" --target $targets > "$out/build.log" 2>&1; then
  grep -E "error" "$out/build.log" | head -20; note "build: failed (build.log)"; exit 1
fi
note "build: $(( $(date +%s) - t0 )) s"

plan="$out/plan.json"
bash bench/one_gpu_plan.sh eager-bench samples/models/llama3.2-1b.json "$cluster" 2048 4 32 bf16 > "$plan"

# run NAME COMMAND...: under timeout of the time left; its output in NAME.log, its result noted.
run() {
  local name="$1"; shift
  local l; l=$(left)
  if [ "$l" -lt 40 ]; then note "$name: skipped, ${l} s left of BUDGET_S=$budget"; status=1; return; fi
  local s; s=$(date +%s)
  timeout "$l" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  note "$name: exit $rc in $(( $(date +%s) - s )) s"
  tail -4 "$out/$name.log" | sed 's/^/    /' | tee -a "$out/summary.txt"
  [ "$rc" -eq 0 ] || status=1
}

for task in "$@"; do
  case "$task" in
    tests)
      # The GPU's cases (the CPU ones run in CI): fused ops and fp8 on CUDA, the NCCL engine on one rank.
      run fused_ops "$build/tests/executor/trainplan_fused_ops_tests" --gtest_filter='*Cuda*:NcclEngine.*'
      run quantize "$build/tests/executor/trainplan_finetune_tests" --gtest_filter='Quantize.*' ;;
    profile)
      run profile "$build/executor/executor" --plan "$plan" --device cuda --steps 4 --trace-step 4 --quiet \
        --kernel-profile "$out/kernels.csv" --measurement "$out/profile-measurement.json" ;;
    bench)
      run bench env PYTHON="$python" CLUSTER="$cluster" PEERS="$peers" \
        bench/eager_bench.sh "$build" cuda samples/models/llama3.2-1b.json 2048 4 32 12 "$out/bench.json" ;;
    exactness)
      run exactness env PYTHON="$python" CLUSTER="$cluster" \
        bench/fused_exactness.sh "$build" cuda samples/models/llama3.2-1b.json 2048 4 32 10 "$out/exactness.json" ;;
    finetune:*)
      v="${task#finetune:}"
      # shellcheck disable=SC2086  # the shape is words
      run "finetune-$v" env VARIANTS="$v" CLUSTER="$cluster" PYTHON="$python" \
        bench/finetune_bench.sh "$build" cuda ${FINETUNE:-samples/models/llama3-8b.json 4096 2 16 5} "$out/finetune-$v.json" ;;
    fp8-loss)
      run fp8-loss env CLUSTER="$cluster" PYTHON="$python" \
        bench/fp8_loss.sh "$build" cuda samples/models/llama3.2-1b.json 2048 4 4 200 "$out/fp8-loss.json" ;;
    fp8-speed)
      if ! "$python" -c "import torchao.float8" 2>/dev/null && ls .whl/torchao-*.whl > /dev/null 2>&1; then
        "$python" -m pip install -q --no-index --no-deps --no-compile --target /tmp/torchao-site .whl/torchao-*.whl > "$out/torchao-install.log" 2>&1
        export PYTHONPATH="/tmp/torchao-site${PYTHONPATH:+:$PYTHONPATH}"
      fi
      read -r fm fs fmb fgb fsteps <<< "${FP8_SPEED:-samples/models/llama3.2-3b.json 4096 1 4 6}"
      run fp8-speed env PRECISION=fp8 PEERS=compile-float8 PYTHON="$python" CLUSTER="$cluster" \
        bench/eager_bench.sh "$build" cuda "$fm" "$fs" "$fmb" "$fgb" "$fsteps" "$out/fp8-speed.json"
      run bf16-speed env PRECISION=bf16 PEERS=none PYTHON="$python" CLUSTER="$cluster" \
        bench/eager_bench.sh "$build" cuda "$fm" "$fs" "$fmb" "$fgb" "$fsteps" "$out/bf16-speed.json" ;;
    hwprofile)
      run hwprofile "$build/planner/planner" profile --device cuda --base "$cluster" --executor "$build/executor/executor" \
        --out "$out/hwprofile.json" ;;
  esac
done
note "total: $(( $(date +%s) - t0 )) s"
exit "$status"

#!/usr/bin/env bash
# Fine-tuning on one device against the cost model (issue 15's GPU check): trains one plan shape
# from random weights as LoRA, QLoRA (NF4 and INT8) and LoRA with the optimizer offloaded to the
# CPU, all seven projections adapted at rank 16, and sets each measurement beside the estimate of
# the same plan (the trainplan stack): tokens/s, MFU, the peaks of allocated and reserved memory.
#
#   bench/finetune_bench.sh BUILD_DIR DEVICE MODEL SEQ MICRO GLOBAL STEPS [OUT_JSON]
#   GPU: CLUSTER=dgx-h100 bench/finetune_bench.sh /tmp/build cuda samples/models/llama3-8b.json 4096 2 16 8 out.json
#
# Environment: VARIANTS (comma-separated, default lora,qlora-nf4,qlora-int8,lora-offload),
# CLUSTER (default dgx-h100), THREADS (CPU threads), PYTHON (default .venv/bin/python, else
# python3). Exit 0 when every variant trained, 1 when one failed (its output is shown), 2 on bad
# input. Memory is compared where the device reports it (GPUs; CPU ranks count allocations).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ $# -ge 7 ] || { sed -n '7,8p' "$0" >&2; exit 2; }
build="$1" device="$2" model="$3" seq="$4" micro="$5" global="$6" steps="$7" out="${8:-}"
cluster="${CLUSTER:-dgx-h100}"
threads="${THREADS:-0}"
variants="${VARIANTS:-lora,qlora-nf4,qlora-int8,lora-offload}"
python="${PYTHON:-$here/.venv/bin/python}"
[ -x "$python" ] || python=python3
exe="$build/executor/executor" planner="$build/planner/planner"
for f in "$exe" "$planner"; do [ -x "$f" ] || { echo "finetune_bench: $f not built" >&2; exit 2; }; done
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$here/bench/one_gpu_plan.sh" finetune "$model" "$cluster" "$seq" "$micro" "$global" bf16 > "$work/base.json"
failed=0
IFS=',' read -ra names <<< "$variants"
for v in "${names[@]}"; do
  "$python" - "$work/base.json" "$v" > "$work/$v.plan.json" <<'PY' || { echo "finetune_bench: unknown variant $v (lora, qlora-nf4, qlora-int8, lora-offload)" >&2; exit 2; }
import json, sys
plan, variant = json.load(open(sys.argv[1])), sys.argv[2]
lora = {"rank": 16, "targets": ["q", "k", "v", "o", "gate", "up", "down"]}
modes = {"lora": ("lora", None, "none"), "qlora-nf4": ("qlora", "nf4", "none"), "qlora-int8": ("qlora", "int8", "none"),
         "lora-offload": ("lora", None, "cpu")}
if variant not in modes:
    sys.exit(1)
mode, base, offload = modes[variant]
if base:
    lora["base_format"] = base
plan["name"] = "finetune-" + variant
plan["training"].update({"mode": mode, "lora": lora})
plan["parallel"]["offload_optimizer"] = offload
print(json.dumps(plan, indent=1))
PY
  "$planner" evaluate "$work/$v.plan.json" --format json > "$work/$v.estimate.json"
  echo "finetune_bench: $v, $(basename "$model") seq $seq, micro-batch $micro, global batch $global, $steps steps on $device"
  if ! "$exe" --plan "$work/$v.plan.json" --device "$device" --steps "$steps" --threads "$threads" --quiet \
      --measurement "$work/$v.measurement.json" > "$work/$v.log" 2>&1; then
    cat "$work/$v.log"
    failed=1
  fi
done
"$python" - "$work" "$variants" "$out" "$*" "$failed" <<'PY'
import json, os, sys
work, variants, out, args, failed = sys.argv[1:6]
gib = 2.0 ** 30
rows = []
print(f"{'variant':<14} {'tokens/s':>10} {'predicted':>10} {'error':>7} {'MFU':>6} {'allocated GiB':>14} {'predicted':>10} "
      f"{'reserved GiB':>13} {'predicted':>10}")
for v in variants.split(","):
    e = json.load(open(f"{work}/{v}.estimate.json"))
    e = e.get("estimate", e)
    path = f"{work}/{v}.measurement.json"
    if not os.path.exists(path):
        print(f"{v:<14} did not run")
        continue
    m = json.load(open(path))
    tps, tps_e = m["throughput"]["tokens_per_second"], e["throughput"]["tokens_per_second"]
    mfu = m["throughput"].get("mfu")
    alloc, reserved = m["memory"].get("peak_allocated_bytes"), m["memory"].get("peak_reserved_bytes")
    alloc_e, reserved_e = e["memory"]["total_bytes"], e["memory"]["reserved_bytes"]
    fmt = lambda x, w: f"{x / gib:{w}.2f}" if x is not None else f"{'-':>{w}}"
    print(f"{v:<14} {tps:10.0f} {tps_e:10.0f} {100 * (tps / tps_e - 1):+6.1f}% {('%5.1f%%' % (100 * mfu)) if mfu else '     -'} "
          f"{fmt(alloc, 14)} {fmt(alloc_e, 10)} {fmt(reserved, 13)} {fmt(reserved_e, 10)}")
    rows.append({"variant": v, "measurement": m, "estimate": e})
if out:
    json.dump({"schema": "trainplan/bench/finetune/v1", "command": "bench/finetune_bench.sh " + args, "variants": rows},
              open(out, "w"), indent=1)
sys.exit(int(failed))
PY

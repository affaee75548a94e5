#!/usr/bin/env python3
"""The cost model's predictions of the bench/stack_runs.sh runs beside what they measured.

    bench/stack_predictions.py PLANNER RUNS_DIR      (from the repository root: the plans name their
                                                     models by paths relative to it)

For each run in RUNS_DIR: torchtitan logs (titan-*.log: the median tokens/s of the steps after the
first, as `planner compare` reads them, and the peak reserved memory torchtitan prints) and
bench/stack_train.py documents (deepspeed.json, accelerate.json: the median step after the warm-up
steps, peak reserved). The plan is bench/stacks/RUN.plan.json, predicted with `planner evaluate`
for the stack its export runs on (`planner export` maps torchtitan to fsdp2 or fsdp2-compile,
deepspeed to deepspeed, accelerate on one GPU to hf-ddp: DDP under autocast), and again with each plan's
attention kernel set to the profile's measured table (SDPA's cuDNN backend) and to FlashAttention-2.
Differences are predicted tokens/s over measured (the step's columns) and predicted reserved bytes over
measured, minus one: positive means the model is too fast or too large."""
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

GIB = 2.0 ** 30


def evaluate(planner, plan, stack, attention=None):
    with open(plan) as f:
        doc = json.load(f)
    doc["training"]["stack"] = stack
    if stack == "hf-ddp":  # Accelerate without FSDP is DDP: nothing sharded (as planner export predicts it)
        doc["parallel"]["zero_stage"] = 0
    if attention:
        doc["training"]["attention_kernel"] = attention
    with tempfile.NamedTemporaryFile("w", suffix=".plan.json", delete=False) as f:
        json.dump(doc, f)
        path = f.name
    try:
        out = subprocess.run([planner, "evaluate", path, "--format", "json"], capture_output=True, text=True, check=True)
    finally:
        os.unlink(path)
    e = json.loads(out.stdout)
    return e["time"]["step_seconds"], e["memory"]["reserved_bytes"]


def torchtitan_log(path, tokens_per_step):
    tps, memory = [], []
    step = re.compile(r"step:\s*(\d+)\s.*?memory:\s*([0-9.]+)GiB.*?tps:\s*([0-9,]+)")
    with open(path, errors="replace") as f:
        for line in f:
            m = step.search(re.sub(r"\x1b\[[0-9;]*m", "", line))
            if m:
                memory.append(float(m.group(2)) * GIB)
                tps.append(float(m.group(3).replace(",", "")))
    if not tps:
        return None
    steady = tps[1:] if len(tps) > 1 else tps
    return tokens_per_step / statistics.median(steady), max(memory)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.split("\n\n")[1])
    planner, runs = sys.argv[1], sys.argv[2]
    here = os.path.dirname(os.path.abspath(__file__))
    rows = []
    for log in sorted(glob.glob(os.path.join(runs, "titan-*.log"))):
        run = os.path.basename(log)[:-4]
        plan = os.path.join(here, "stacks", run + ".plan.json")
        with open(plan) as f:
            t = json.load(f)["training"]
        measured = torchtitan_log(log, t["global_batch"] * t["seq_len"])
        if measured:
            rows.append((run, t.get("stack", "fsdp2"), plan, *measured))
    for run, stack in (("deepspeed", "deepspeed"), ("accelerate", "hf-ddp")):
        path = os.path.join(runs, run + ".json")
        if os.path.exists(path):
            with open(path) as f:
                d = json.load(f)
            plan = os.path.join(here, "stacks", ("deepspeed-zero3" if run == "deepspeed" else run) + ".plan.json")
            rows.append((run, stack, plan, d["median_step_seconds"], d["peak_reserved_bytes"]))
    print(f"{'run':<24} {'stack':<14} {'step s':>7} {'predicted':>9} {'diff':>7} {'cuDNN':>7} {'FA2':>7} "
          f"{'reserved GiB':>12} {'predicted':>9} {'diff':>7}")
    for run, stack, plan, step, reserved in rows:
        p_step, p_reserved = evaluate(planner, plan, stack)
        cudnn, _ = evaluate(planner, plan, stack, "profile")
        fa2, _ = evaluate(planner, plan, stack, "flash2")
        print(f"{run:<24} {stack:<14} {step:7.3f} {p_step:9.3f} {100 * (step / p_step - 1):+6.1f}% "
              f"{100 * (step / cudnn - 1):+6.1f}% {100 * (step / fa2 - 1):+6.1f}% "
              f"{reserved / GIB:12.2f} {p_reserved / GIB:9.2f} {100 * (p_reserved / reserved - 1):+6.1f}%")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The cost model's predictions of committed GPU runs, on the cluster preset each run named and on
a measured hardware profile (issue 31: `planner profile --device cuda` of the lent GPU), beside
what each run measured: step time and peak allocated memory.

    bench/predict_gpu_runs.py PLANNER PROFILE RUN.json...
    e.g. bench/predict_gpu_runs.py build/planner/planner hwprofiles/measured/h200.json bench/gpu/*-h200*.json

A RUN is any JSON file bench/ wrote that holds executor measurements: an eager_bench document
(its `executor`), a finetune_bench document (each variant's `measurement`), an fp8_loss document
(its `runs`), or a measurement itself. Each measurement's plan is rebuilt from its own fields (model
document, cluster, parallel and training sections, and the stack the run was made with)."""
import json, os, subprocess, sys, tempfile


def measurements(doc):
    if doc.get("schema", "").startswith("trainplan/measurement"):
        yield "", doc
    if isinstance(doc.get("executor"), dict):
        yield "", doc["executor"]
    for v in doc.get("variants", []) if isinstance(doc.get("variants"), list) else []:
        yield v["variant"], v["measurement"]
    for name, run in (doc.get("runs") or {}).items():
        yield name, run


def predict(planner, m, cluster, work):
    model = os.path.join(work, "model.json")
    with open(model, "w") as f:
        json.dump(m["model_document"], f)
    plan = {"schema": "trainplan/plan/v1", "name": m.get("name", "run"), "model": model, "cluster": cluster, "gpus": m["gpus"],
            "training": m["training"], "parallel": m["parallel"]}
    path = os.path.join(work, "plan.json")
    with open(path, "w") as f:
        json.dump(plan, f)
    out = subprocess.run([planner, "evaluate", path, "--format", "json"], capture_output=True, text=True)
    if out.returncode != 0:
        return None
    e = json.loads(out.stdout)
    return e["time"]["step_seconds"], e["memory"]["total_bytes"]


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__.split("\n\n")[1])
    planner, profile, runs = sys.argv[1], os.path.abspath(sys.argv[2]), sys.argv[3:]
    gib = 2.0 ** 30
    print(f"{'run':<52} {'step (s)':>9} {'preset':>15} {'measured profile':>17} {'peak GiB':>9} {'preset':>7}")
    with tempfile.TemporaryDirectory() as work:
        for run in runs:
            doc = json.load(open(run))
            for label, m in measurements(doc):
                name = os.path.basename(run) + (f" [{label}]" if label else "")
                step, peak = m["time"]["step_seconds"], m["memory"].get("peak_allocated_bytes") or m["memory"].get("total_bytes")
                preset = predict(planner, m, m["cluster"], work)
                measured = predict(planner, m, profile, work)
                cell = lambda p: "-" if p is None else f"{p[0]:.4f} {100 * (p[0] / step - 1):+5.1f}%"
                print(f"{name:<52} {step:9.4f} {cell(preset):>15} {cell(measured):>17} {peak / gib:9.2f} "
                      f"{'-' if preset is None else f'{preset[1] / gib:7.2f}'}")


if __name__ == "__main__":
    main()

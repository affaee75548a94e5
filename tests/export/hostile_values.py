#!/usr/bin/env python3
"""No text from a document or an option runs in a file the planner generates (issue 33, item 5).

A plan named with every shell, TOML, YAML and Python breaker that single-line text can hold
(quotes, backslashes, $(...), backticks, ;, #, brackets, colons), of a model of that name, saved
in a directory whose name holds them too, goes through every generator: `planner launch` (the
torchrun command), `planner launch --slurm` (with the job name, partition, account and executor
arguments hostile as well) and every `planner export`. The shell outputs run under bash with
stand-in torchrun and srun that record their arguments; the TOML, YAML and JSON outputs are
parsed, and the torchtitan flavor line the export asks the user to paste is run as Python.
Asserted: no command from the values ran (no file "PWNED" appears), and every value reads back
as the literal text. Control characters are refused where the document is read (tested in
tests/planner/export_test.cpp, HostileNames).

Usage: hostile_values.py --planner BUILD/planner/planner --work DIR      (exit 0 = safe)
"""

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tomllib

HOSTILE = "a\"b\\c 'q' $(touch PWNED) `touch PWNED` ; touch PWNED # ] = [x] : {y} - *"


def stand_ins(directory, record):
    """torchrun and srun that record their arguments and do nothing else; scontrol names one node."""
    for name in ("torchrun", "srun"):
        path = os.path.join(directory, name)
        with open(path, "w") as f:
            f.write(f"#!{sys.executable}\nimport json, os, sys\n"
                    f"with open({record!r}, 'a') as out: out.write(json.dumps({{'tool': {name!r}, 'argv': sys.argv[1:]}}) + '\\n')\n")
        os.chmod(path, 0o755)
    scontrol = os.path.join(directory, "scontrol")  # `scontrol show hostnames`: the allocation's first node
    with open(scontrol, "w") as f:
        f.write("#!/bin/sh\necho node1\n")
    os.chmod(scontrol, 0o755)


def run_bash(script_text, work, bin_dir, env_extra=None):
    path = os.path.join(work, "generated.sh")
    with open(path, "w") as f:
        f.write(script_text)
    env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ["PATH"], SLURM_JOB_ID="42", SLURM_NNODES="1", SLURM_NODEID="0",
               SLURM_JOB_NODELIST="node1", **(env_extra or {}))
    return subprocess.run(["bash", path], cwd=work, env=env, capture_output=True, text=True, timeout=60)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--planner", required=True)
    ap.add_argument("--work", required=True)
    args = ap.parse_args()
    planner = os.path.abspath(args.planner)

    root = os.path.abspath(args.work)
    shutil.rmtree(root, ignore_errors=True)
    work = os.path.join(root, "dir it's $(touch PWNED) `touch PWNED`; x")
    bin_dir = os.path.join(root, "bin")
    os.makedirs(work)
    os.makedirs(bin_dir)
    record = os.path.join(root, "calls.jsonl")
    stand_ins(bin_dir, record)
    failures = []

    def check(ok, what):
        print(("ok    " if ok else "FAIL  ") + what)
        if not ok:
            failures.append(what)

    # A Llama-style model of a shape torchtitan has no flavor for (the export then writes the
    # flavor line to paste), named with the hostile text.
    model = {"schema": "trainplan/model/v1", "name": HOSTILE, "source": HOSTILE, "architecture": "llama", "layers": 4, "hidden": 512,
             "heads": 8, "kv_heads": 4, "ffn_hidden": 1536, "vocab": 32000, "tied_embeddings": False, "max_seq_len": 2048}
    model_path = os.path.join(work, "model it's.json")
    json.dump(model, open(model_path, "w"))
    plan_path = os.path.join(work, "plan $(touch PWNED).json")
    made = subprocess.run([planner, "--model", model_path, "--gpus", "8", "--fix", "tp=1", "--fix", "pp=1", "--fix", "zero=3", "--fix",
                           "recompute=none", "--top", "1", "--quiet", "--save-plan", plan_path], capture_output=True, text=True, cwd=work)
    if made.returncode != 0 or not os.path.exists(plan_path):
        print(f"hostile_values: the planner made no plan: {made.stdout[-800:]}{made.stderr}", file=sys.stderr)
        return 1
    plan = json.load(open(plan_path))
    plan["name"] = HOSTILE
    json.dump(plan, open(plan_path, "w"))

    def planner_out(*argv):
        r = subprocess.run([planner, *argv], capture_output=True, text=True, cwd=work)
        if r.returncode != 0:
            raise RuntimeError(f"planner {' '.join(argv)} failed: {r.stderr}")
        return r.stdout

    def calls():
        if not os.path.exists(record):
            return []
        lines = [json.loads(line) for line in open(record)]
        os.remove(record)
        return lines

    # planner launch: the torchrun command, run as a user pastes it.
    command = planner_out("launch", plan_path, "--nodes", "1", "--executor", os.path.join(work, "exe $(touch PWNED)"),
                          "--extra", shlex.quote(HOSTILE))
    command = "\n".join(line for line in command.splitlines() if line.startswith("torchrun"))
    r = run_bash(command + "\n", work, bin_dir)
    got = calls()
    check(r.returncode == 0 and len(got) == 1, f"launch: the torchrun command runs once under bash (exit {r.returncode} {r.stderr.strip()[:200]})")
    if got:
        argv = got[0]["argv"]
        check(os.path.join(work, "exe $(touch PWNED)") in argv, "launch: the executor path reaches torchrun as itself")
        check(plan_path in argv, "launch: the plan path reaches torchrun as itself")
        check(HOSTILE in argv, "launch: the --extra word reaches the executor as itself")

    # planner launch --slurm. SLURM's own fields go into #SBATCH lines, which sbatch splits and
    # unquotes itself: anything but a plain name is refused there, naming the option.
    for flag in ("--job-name", "--partition", "--account"):
        r = subprocess.run([planner, "launch", plan_path, "--nodes", "1", "--slurm", flag, HOSTILE], capture_output=True, text=True, cwd=work)
        check(r.returncode == 2 and f"{flag}: " in r.stderr and not r.stdout, f"launch --slurm {flag} HOSTILE: refused, naming {flag}, nothing written")
    script = planner_out("launch", plan_path, "--nodes", "1", "--slurm", "--job-name", "trainplan-70b", "--partition", "gpu",
                         "--executor", os.path.join(work, "exe $(touch PWNED)"), "--extra", shlex.quote(HOSTILE))
    r = run_bash(script, work, bin_dir)
    got = calls()
    check(r.returncode == 0 and len(got) == 1, f"launch --slurm: the script runs under bash, srun once (exit {r.returncode} {r.stderr.strip()[:200]})")
    if got:
        check(plan_path in got[0]["argv"] and HOSTILE in got[0]["argv"], "launch --slurm: plan path and --extra reach srun as themselves")
    directives = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    for line in directives:  # sbatch reads these as its own arguments, split like a command line
        check(len(shlex.split(line[len("#SBATCH"):])) == 1, f"launch --slurm: {line[:60]}... is one sbatch argument")

    # Every export.
    for target, ext in (("megatron", "sh"), ("torchtitan", "toml"), ("deepspeed", "json"), ("accelerate", "yaml"), ("litgpt", "yaml")):
        out = os.path.join(work, f"export.{ext}")
        r = subprocess.run([planner, "export", plan_path, "--to", target, "--out", out], capture_output=True, text=True, cwd=work)
        if r.returncode != 0:
            check("cannot" in r.stderr or ": " in r.stderr, f"export {target}: refused ({r.stderr.strip()[:120]})")
            continue
        text = open(out).read()
        if target == "megatron":
            run = run_bash(text, work, bin_dir)
            got = calls()
            check(run.returncode == 0 and len(got) == 1, f"export megatron: the script runs under bash, torchrun once (exit {run.returncode})")
        elif target == "torchtitan":
            doc = tomllib.loads(text)
            check(doc["job"]["description"] == "trainplan plan " + HOSTILE, "export torchtitan: job.description reads back as the literal name")
            check(doc["model"]["flavor"] == HOSTILE, "export torchtitan: model.flavor reads back as the literal model name")
            snippet = next(line for line in text.splitlines() if "llama3_args[" in line).lstrip("#").strip()
            registered = {}
            exec(snippet, {"llama3_args": registered, "TransformerModelArgs": lambda **kw: kw})
            check(list(registered) == [HOSTILE], "export torchtitan: the flavor line, run as Python, registers the literal model name")
        elif target == "deepspeed":
            json.loads(text)
            check(True, "export deepspeed: parses as JSON")
        elif target == "accelerate":
            import yaml

            doc = yaml.safe_load(text)
            check(isinstance(doc, dict) and doc.get("distributed_type") in ("FSDP", "MULTI_GPU", "DEEPSPEED", "NO"), "export accelerate: parses as YAML")
        else:
            import yaml

            doc = yaml.safe_load(text)
            check(doc.get("model_name") == HOSTILE and doc["model_config"]["name"] == HOSTILE,
                  "export litgpt: model_name and model_config.name read back as the literal model name")
        # Comments stay comments: every line that mentions the name starts a comment or holds it quoted.
        for line in text.splitlines():
            if "touch PWNED" in line and not line.lstrip().startswith("#"):
                check((target == "torchtitan" and ("description = " in line or "flavor = " in line))
                      or (target == "litgpt" and line.lstrip().startswith(("model_name: ", "name: "))),
                      f"export {target}: the name appears outside a comment only as a quoted value: {line[:80]}")

    pwned = [os.path.join(d, f) for d, _, files in os.walk(root) for f in files if f == "PWNED"]
    check(not pwned, "nothing ran: no file PWNED was made" + (f" (found {pwned})" if pwned else ""))
    print(f"\n{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

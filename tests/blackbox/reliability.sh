#!/usr/bin/env bash
# Black-box checks of the reliability items of issue 14: runs the planner (and the executor under
# mpirun on CPU ranks) as a user would, and checks exit codes, messages, files left behind, and
# what a generated launch script really passes to the executor.
#
#   tests/blackbox/reliability.sh PLANNER [EXECUTOR [MPIRUN]]
#
# Prints PASS/FAIL per check. Exit 0: every check passed; 1: a check failed; 77: the planner
# checks passed but the executor ones were skipped (no EXECUTOR given or built, or no mpirun).
set -u

planner=${1:?usage: reliability.sh PLANNER [EXECUTOR [MPIRUN]]}
executor=${2:-}
mpirun=${3:-$(command -v mpirun || true)}
work=$(mktemp -d "${TMPDIR:-/tmp}/trainplan-reliability.XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0

pass() { echo "PASS: $1"; }
fail() { echo "FAIL: $1"; failures=$((failures + 1)); }

# run ARGS...: runs the command; sets rc, out (stdout) and err (stderr).
run() {
  "$@" >"$work/stdout" 2>"$work/stderr"
  rc=$?
  out=$(cat "$work/stdout")
  err=$(cat "$work/stderr")
}

# expect NAME RC FRAGMENT...: the last run exited RC and its stderr holds every FRAGMENT.
expect() {
  local name=$1 want=$2
  shift 2
  if [ "$rc" != "$want" ]; then
    fail "$name: exit code $rc, expected $want; stderr: $err"
    return
  fi
  local fragment
  for fragment in "$@"; do
    if [[ "$err" != *"$fragment"* ]]; then
      fail "$name: no \"$fragment\" in stderr: $err"
      return
    fi
  done
  pass "$name"
}

# --- A fixed plan to work with -----------------------------------------------------------------
run "$planner" --model 8b --gpus 8 --quiet --save-plan "$work/plan.json"
if [ "$rc" != 0 ] || [ ! -f "$work/plan.json" ]; then
  fail "planner --save-plan writes a plan (exit $rc): $err"
  exit 1
fi

# --- Duplicate JSON keys are refused, naming the key and its JSON pointer -----------------------
sed 's/"parallel": {/"parallel": {\n    "tp": 2,/' "$work/plan.json" >"$work/duplicate.json"
run "$planner" evaluate "$work/duplicate.json"
expect "a duplicate key in a plan is refused naming its pointer" 2 "duplicate.json: /parallel/tp: duplicate key \"tp\""
sed '1s/^{/{"name": "again", /' "$work/plan.json" >"$work/duplicate-top.json"
run "$planner" launch "$work/duplicate-top.json" --nodes 1
expect "a duplicate top-level key is refused (launch)" 2 "duplicate-top.json: /name: duplicate key \"name\""

# --- Files: a directory given as a JSON file; a failed --save-plan leaves no .tmp ----------------
mkdir -p "$work/adir" "$work/model.json"
run "$planner" evaluate "$work/adir"
expect "a directory given as a plan file says \"is a directory\"" 2 "$work/adir: is a directory"
run "$planner" --model "$work/model.json" --gpus 8 --quiet
expect "a directory given as a model file says \"is a directory\"" 2 "$work/model.json: is a directory"
run "$planner" --model 8b --gpus 8 --quiet --save-plan "$work/adir"
expect "--save-plan onto a directory fails saying so" 2 "$work/adir: is a directory"
if [ -e "$work/adir.tmp" ]; then fail "--save-plan onto a directory left $work/adir.tmp"; else pass "--save-plan onto a directory leaves no .tmp"; fi
run "$planner" --model 8b --gpus 8 --quiet --save-plan "$work/missing/plan.json"
expect "--save-plan into a missing directory fails" 2 "$work/missing/plan.json: cannot write"
if compgen -G "$work/missing*" >/dev/null || compgen -G "$work/*.tmp" >/dev/null; then
  fail "a failed --save-plan left files: $(ls "$work")"
else
  pass "a failed --save-plan leaves no .tmp"
fi

# --- launch --extra: every argument reaches the executor as one literal word ---------------------
# A fake executor that writes its arguments NUL-separated, and fake torchrun/srun/scontrol that
# start it as the real ones would.
mkdir -p "$work/bin" "$work/cwd"
cat >"$work/bin/fake-executor" <<'SH'
#!/usr/bin/env bash
printf '%s\0' "$@" >"$ARGV_FILE"
for a in "$@"; do printf 'argv: %s\n' "$a"; done
SH
cat >"$work/bin/torchrun" <<'SH'
#!/usr/bin/env bash
while [ $# -gt 0 ] && [ "$1" != --no-python ]; do shift; done
shift
exec "$@"
SH
cat >"$work/bin/srun" <<'SH'
#!/usr/bin/env bash
while [ $# -gt 0 ] && [[ "$1" == --* ]]; do shift; done
exec "$@"
SH
printf '#!/usr/bin/env bash\necho localhost\n' >"$work/bin/scontrol"
chmod +x "$work/bin/"*

newline_value=$'line one\nline two'
extra_args=(--extra 'a;b' --extra "'\$(touch pwned)'" --extra "\"it's \\\"quoted\\\"\"" --extra "'$newline_value'" --extra '--seed 7')
expected=('a;b' '$(touch pwned)' "it's \"quoted\"" "$newline_value" '--seed' '7')

# check_launch_script NAME SCRIPT: runs SCRIPT under bash with the fakes and checks the arguments.
check_launch_script() {
  local name=$1 script=$2
  rm -f "$work/argv" "$work/cwd/pwned" "$work/pwned"
  (cd "$work/cwd" && PATH="$work/bin:$PATH" ARGV_FILE="$work/argv" SLURM_JOB_NODELIST=node1 SLURM_JOB_ID=42 bash "$script") \
    >"$work/script.out" 2>&1
  local script_rc=$?
  if [ "$script_rc" != 0 ] || [ ! -f "$work/argv" ]; then
    fail "$name: the script failed (exit $script_rc): $(cat "$work/script.out")"
    return
  fi
  local got=()
  while IFS= read -r -d '' word; do got+=("$word"); done <"$work/argv"
  local tail=("${got[@]: -${#expected[@]}}")
  local ok=1 i
  for i in "${!expected[@]}"; do
    if [ "${tail[$i]}" != "${expected[$i]}" ]; then
      ok=0
      fail "$name: argument $i is \"${tail[$i]}\", expected \"${expected[$i]}\" (all: $(printf '[%s] ' "${got[@]}"))"
    fi
  done
  if [ -e "$work/cwd/pwned" ] || [ -e "$work/pwned" ]; then
    ok=0
    fail "$name: \$(touch pwned) ran"
  fi
  [ "$ok" = 1 ] && pass "$name: a;b, \$(touch pwned), it's \"quoted\" and a newline each arrive as one literal argument, nothing ran"
}

run "$planner" launch "$work/plan.json" --nodes 1 --executor "$work/bin/fake-executor" "${extra_args[@]}"
if [ "$rc" = 0 ]; then
  printf '%s\n' "$out" >"$work/torchrun.sh"
  check_launch_script "launch (torchrun) --extra" "$work/torchrun.sh"
else
  fail "launch with --extra exits $rc: $err"
fi
run "$planner" launch "$work/plan.json" --nodes 1 --slurm --executor "$work/bin/fake-executor" "${extra_args[@]}"
if [ "$rc" = 0 ]; then
  printf '%s\n' "$out" >"$work/slurm.sh"
  check_launch_script "launch --slurm --extra" "$work/slurm.sh"
else
  fail "launch --slurm with --extra exits $rc: $err"
fi
run "$planner" launch "$work/plan.json" --nodes 1 --extra "--note 'unclosed"
expect "an unbalanced quote in --extra is bad input" 2 "--extra" "unbalanced single quote"

# --- launch --gpus-per-node ----------------------------------------------------------------------
run "$planner" launch "$work/plan.json" --nodes 1 --gpus-per-node 0
expect "launch --gpus-per-node 0 is refused" 2 "--gpus-per-node: must be >= 1 (got 0)"
run "$planner" launch "$work/plan.json" --nodes 3 --gpus-per-node 3
expect "--gpus-per-node not dividing the plan's GPUs says so" 2 "--gpus-per-node 3 does not divide 8"

# --- --fix values that contradict each other or the model/cluster --------------------------------
run "$planner" --model 8b --gpus 32 --quiet --fix tp=8 --fix pp=8
expect "--fix tp=8 --fix pp=8 on 32 GPUs names both" 2 "--fix tp=8 x --fix pp=8 = 64 > 32 GPUs"
run "$planner" --model 8b --gpus 32 --quiet --fix tp=3
expect "--fix tp=3 names the heads rule" 2 "--fix tp=3: tp must divide the model's attention heads (32)"
run "$planner" --model 8b --gpus 32 --quiet --fix schedule=interleaved --fix pp=1
expect "--fix schedule=interleaved --fix pp=1 names both" 2 "--fix schedule=interleaved needs pp > 1, but --fix pp=1"
run "$planner" --model 8b --gpus 32 --quiet --fix mb=3
expect "--fix mb=3 names the global batch" 2 "--fix mb=3: the micro-batch must divide the global batch (512 sequences)"
run "$planner" --model 8b --gpus 32 --quiet --fix tp=2 --fix tp=4
expect "--fix tp=2 --fix tp=4 contradict" 2 "--fix tp=2 and --fix tp=4 contradict each other"
if [[ "$err" == *"no combination"* ]]; then fail "--fix conflicts still say \"no combination fits\""; fi

# --- Output text ---------------------------------------------------------------------------------
run "$planner" --model 405b --gpus 1024 --quiet
if [ "$rc" = 0 ] && [[ "$out" =~ Checkpoint\ [0-9.]+\ TB, ]] && [[ "$out" != *" K GB"* ]]; then
  pass "checkpoint sizes use a unit ladder (${BASH_REMATCH[0]})"
else
  fail "checkpoint size text (exit $rc): $(grep -m1 Checkpoint <<<"$out")"
fi
run "$planner" --model 8b --gpus 8 --global-batch 8 --fix tp=1 --fix pp=1 --fix dp=8 --fix mb=1 --quiet --save-plan "$work/one-mb.json"
run "$planner" evaluate "$work/one-mb.json"
if [ "$rc" = 0 ] && [[ "$out" == *"1 micro-batch"* ]] && [[ "$out" != *" 1 micro-batches"* ]]; then
  pass "one micro-batch is singular"
else
  fail "one micro-batch (exit $rc): $(grep -m2 micro-batch <<<"$out")"
fi
# 1e18 tokens on one GPU: hundreds of millions of days, which "%.1f" printed as "189082312.5".
run "$planner" --model 1.1b --gpus 1 --train-tokens 1e18 --quiet
table=$(sed -n '/^#\? *Top plans/,/^$/p' <<<"$out" | sed '1d;/^$/d')
widths=$(awk '{ print length($0) }' <<<"$table" | sort -u | wc -l)
widest_cell=$(tr -s ' ' '\n' <<<"$table" | awk '{ if (length($0) > n) n = length($0) } END { print n + 0 }')
if [ "$rc" = 0 ] && [ -n "$table" ] && [ "$widths" = 1 ] && [ "$widest_cell" -le 10 ]; then
  pass "huge values keep the plan table aligned and its cells short (widest $widest_cell characters)"
else
  fail "huge values: table rows of $widths widths, widest cell $widest_cell (exit $rc):"$'\n'"$table"
fi
run "$planner" --model 8b --gpus 8 --train-tokens 15X --quiet
expect "--train-tokens lists every accepted suffix" 2 "unknown suffix \"X\"" "K, M, G or B, T, P" "Ki, Mi, Gi, Ti, Pi"
run "$planner" --model 8b --gpus 8 --quiet --format csv
total=$(sed -n 2p <<<"$out" | cut -d, -f16)
if [ "$rc" = 0 ] && [[ "$total" =~ ^[0-9]{8,}(\.[0-9]+)?$ ]]; then
  pass "CSV keeps full precision (memory_total_bytes $total)"
else
  fail "CSV precision: memory_total_bytes \"$total\" (exit $rc)"
fi

# --- Executor: resume falls back from a damaged checkpoint; rank-prefixed errors -----------------
if [ -z "$executor" ] || [ ! -x "$executor" ] || [ -z "$mpirun" ]; then
  echo "SKIP: executor checks (executor not built${executor:+ at $executor}, or no mpirun)"
  [ "$failures" = 0 ] && exit 77
  echo "$failures check(s) failed"
  exit 1
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
mpi=("$mpirun" --oversubscribe -n 2)
cat >"$work/tiny.json" <<'JSON'
{"schema": "trainplan/plan/v1", "name": "tiny-2", "source": "reliability.sh",
 "model": {"schema": "trainplan/model/v1", "name": "tiny-llama", "source": "samples/models/tiny-llama.json",
           "architecture": "llama", "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn_hidden": 128, "vocab": 256,
           "tied_embeddings": false, "max_seq_len": 64},
 "cluster": "dgx-h100", "gpus": 2,
 "training": {"seq_len": 32, "global_batch": 8, "precision": "fp32", "optimizer": "adamw", "train_tokens": 100000.0},
 "parallel": {"tp": 1, "pp": 1, "dp": 2, "cp": 1, "ep": 1, "zero_stage": 1, "micro_batch": 2, "recompute": "none"}}
JSON
train=("$executor" --plan "$work/tiny.json" --device cpu --threads 1 --quiet)
run "${mpi[@]}" "${train[@]}" --steps 6 --checkpoint-dir "$work/ckpt" --checkpoint-every 2 --stop-after 4
if [ "$rc" != 0 ] || [ ! -f "$work/ckpt/step_000004/manifest.json" ]; then
  fail "executor writes checkpoints at steps 2 and 4 (exit $rc): $out $err"
else
  truncate -s 100 "$work/ckpt/step_000004/shard_00001.bin"
  run "${mpi[@]}" "${train[@]}" --steps 6 --resume "$work/ckpt"
  if [ "$rc" = 0 ] && [[ "$out" == *"resumed from $work/ckpt/step_000002 at step 2"* ]] &&
     [[ "$err" == *"[rank 0] executor: warning: --resume: skipping a damaged checkpoint, $work/ckpt/step_000004"*"truncated"* ]]; then
    pass "resume skips a truncated newest checkpoint for the previous one and says so"
  else
    fail "resume from a truncated newest checkpoint (exit $rc): $out $err"
  fi
  truncate -s 10 "$work/ckpt/step_000002/manifest.json"
  run "${mpi[@]}" "${train[@]}" --steps 6 --resume "$work/ckpt"
  expect "with no intact checkpoint the resume fails naming each damage" 2 "no intact checkpoint" "step_000004" "step_000002/manifest.json"
fi

# Both ranks fail at once (a token file that is not there): every line of theirs has its prefix.
run "${mpi[@]}" "${train[@]}" --steps 2 --data "$work/no-such-tokens.bin"
executor_lines=$(grep 'executor: ' <<<"$err" | grep -v '^\[rank [0-9]*\] executor: ')  # the executor's lines without a prefix
ranks=$(grep -o '^\[rank [0-9]*\] executor: data error' <<<"$err" | sort -u | wc -l)
if [ "$rc" != 0 ] && [ "$ranks" -ge 1 ] && [ -z "$executor_lines" ]; then
  pass "failing ranks prefix every line with their rank ($ranks rank(s) reported)"
else
  fail "rank prefixes (exit $rc, $ranks rank(s)); unprefixed: $executor_lines"$'\n'"$err"
fi

if [ "$failures" != 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"

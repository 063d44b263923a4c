#!/usr/bin/env bash
# GPU check: what the CPU tier cannot show, on one NVIDIA machine, in under 8 minutes (docs/runtime.md, "GPU check").
#
#   1. preconditions: the venv's python, nvidia-smi listing a GPU, torch.cuda.is_available() with vLLM and Ray
#      installed in the venv, coreutils' timeout, and the benchmark's config file;
#   2. gpu-tests: the GPU tier of the tests (every tests/**/test_*.py with a pytest.mark.gpu test, run with -m gpu:
#      vLLM on CUDA, NCCL weight sync); at least one test must pass (a tier that only skipped is a failure);
#   3. benchmark: a short long-tail runtime benchmark, stock / async / asp (max_lag 1) x 2 seeds, with
#      benchmarks/bench_runtime.py on the CUDA platform; its results JSON goes to benchmarks/results/ and must
#      hold every run (bench_runtime.py goes on past a failed run, so its exit code alone proves nothing).
#
# Usage: bash shell/gpu_check.sh [--dry-run] [--keep-going] [--bench auto|always|never]
#   --dry-run     print the preconditions and the commands, run nothing
#   --keep-going  run every step even after one failed (default: stop at the first failure, GPU time is scarce)
#   --bench auto  (default) run the benchmark with 2+ GPUs, skip it with the reason on one: the weight-sync
#                 group is NCCL, and NCCL refuses two ranks (the trainer, an instance) on one device
# Exit: 0 every step passed or was skipped with a reason, 1 a step failed, 2 a precondition failed, 64 bad usage.
#
# Environment (defaults in brackets):
#   ASP_VENV [.venv]  ASP_GPU_CHECK_OUT [runs/gpu_check/<time>]: logs, junit XML and the benchmark's run dirs
#   ASP_GPU_CHECK_CONFIG [configs/tiny_cpu_longtail.yaml]  ASP_GPU_CHECK_RESULTS [benchmarks/results/runtime_gpu_longtail.json]
#   ASP_GPU_CHECK_SEEDS [0,1]  ASP_GPU_CHECK_MODES [stock,async_lag1,asp_lag1]  ASP_GPU_CHECK_INSTANCES [GPUs-1, at most 2]
#   ASP_GPU_CHECK_BENCH_OVERRIDES [run.steps=8]: config overrides of every benchmark run (space-separated)
#   ASP_GPU_CHECK_TESTS_TIMEOUT [180]  ASP_GPU_CHECK_BENCH_TIMEOUT [270]  (seconds per step)
#   ASP_GPU_CHECK_CUDA_PROBE, ASP_GPU_CHECK_TESTS_CMD, ASP_GPU_CHECK_BENCH_CMD: replace the CUDA probe (a command
#   printing the number of CUDA devices) or a step's command (bash -c), to rerun one step by hand or to test
#   this script's own logic on a CPU host (tests/shell/test_gpu_check.py).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 2

dry_run=0
keep_going=0
bench_when=auto
while [ "$#" -gt 0 ]; do
  case "$1" in
    --dry-run) dry_run=1 ;;
    --keep-going) keep_going=1 ;;
    --bench) shift; bench_when="${1:-}" ;;
    --bench=*) bench_when="${1#--bench=}" ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "gpu_check: unknown option '$1' (see --help)" >&2; exit 64 ;;
  esac
  shift
done
case "$bench_when" in
  auto|always|never) ;;
  *) echo "gpu_check: --bench must be auto, always or never, got '$bench_when'" >&2; exit 64 ;;
esac

venv="${ASP_VENV:-$root/.venv}"
py="$venv/bin/python"
out="${ASP_GPU_CHECK_OUT:-$root/runs/gpu_check/$(date +%Y%m%d-%H%M%S)}"
config="${ASP_GPU_CHECK_CONFIG:-configs/tiny_cpu_longtail.yaml}"
results="${ASP_GPU_CHECK_RESULTS:-benchmarks/results/runtime_gpu_longtail.json}"
seeds="${ASP_GPU_CHECK_SEEDS:-0,1}"
modes="${ASP_GPU_CHECK_MODES:-stock,async_lag1,asp_lag1}"
tests_timeout="${ASP_GPU_CHECK_TESTS_TIMEOUT:-180}"
bench_timeout="${ASP_GPU_CHECK_BENCH_TIMEOUT:-270}"
read -r -a bench_overrides <<<"${ASP_GPU_CHECK_BENCH_OVERRIDES-run.steps=8}"
for t in "$tests_timeout" "$bench_timeout"; do
  case "$t" in ''|*[!0-9]*) echo "gpu_check: step timeouts must be whole seconds, got '$t'" >&2; exit 64 ;; esac
done

# The files of the GPU tier: every test module with a test marked gpu (found, not listed, so a new one joins).
mapfile -t gpu_files < <(grep -rlE --include='test_*.py' 'pytest\.mark\.gpu' tests 2>/dev/null | sort)

quote() {  # the arguments as one shell command line: plain words as they are, others quoted
  local a sep=""
  for a in "$@"; do
    if [[ "$a" =~ ^[A-Za-z0-9_./=,:@+%-]+$ ]]; then printf '%s%s' "$sep" "$a"; else printf '%s%q' "$sep" "$a"; fi
    sep=" "
  done
}
tests_cmd_default() {
  quote env -u ASP_PLATFORM "$py" -m pytest -m gpu -q -rs -p no:cacheprovider \
    --junitxml="$out/gpu_tests.xml" "${gpu_files[@]}"
}
bench_cmd_default() {  # $1: instances
  quote env ASP_PLATFORM=cuda "$py" benchmarks/bench_runtime.py --out "$out/bench" --config "$config" \
    --seeds "$seeds" --modes "$modes" --skip-sim --json "$results" run.platform=cuda "asp.instances=$1" \
    "${bench_overrides[@]}"
}
tests_cmd="${ASP_GPU_CHECK_TESTS_CMD:-}"
bench_cmd="${ASP_GPU_CHECK_BENCH_CMD:-}"

if [ "$dry_run" = 1 ]; then
  echo "[gpu-check] dry run: nothing is run"
  echo "preconditions:"
  echo "  venv: $py is executable"
  echo "  nvidia-smi on PATH, and 'nvidia-smi -L' lists at least one GPU"
  echo "  torch.cuda.is_available() in the venv, vllm and ray importable there${ASP_GPU_CHECK_CUDA_PROBE:+ (probe: $ASP_GPU_CHECK_CUDA_PROBE)}"
  echo "  timeout (coreutils) on PATH"
  [ "$bench_when" != never ] && echo "  benchmark config $config exists"
  echo "steps:"
  echo "  1. gpu-tests (timeout ${tests_timeout} s; files: ${gpu_files[*]:-none found}):"
  echo "     ${tests_cmd:-$(tests_cmd_default)}"
  [ -z "$tests_cmd" ] && echo "     then: $out/gpu_tests.xml must record at least one passed test"
  if [ "$bench_when" = never ]; then
    echo "  2. benchmark: skipped (--bench never)"
  else
    echo "  2. benchmark (timeout ${bench_timeout} s; --bench $bench_when: asp.instances = ${ASP_GPU_CHECK_INSTANCES:-GPUs - 1, at most 2}):"
    echo "     ${bench_cmd:-$(bench_cmd_default "${ASP_GPU_CHECK_INSTANCES:-1}")}"
    [ -z "$bench_cmd" ] && echo "     then: $results must be complete (every mode x seed ran)"
  fi
  exit 0
fi

t_start=$SECONDS
say() { echo "[gpu-check] $*"; }

# ------------------------------------------------------------------------------------------ preconditions
problems=()
gpus=0
if [ ! -x "$py" ]; then
  problems+=("venv: $py not found or not executable (create it: bash shell/setup_env.sh gpu,test; or set ASP_VENV)")
fi
if ! command -v nvidia-smi >/dev/null 2>&1; then
  problems+=("nvidia-smi: not found on PATH (no NVIDIA driver on this host?)")
elif ! smi="$(nvidia-smi -L 2>&1)"; then
  problems+=("nvidia-smi: 'nvidia-smi -L' failed: $(echo "$smi" | head -n 2 | tr '\n' ' ')")
elif ! echo "$smi" | grep -q '^GPU '; then
  problems+=("nvidia-smi: 'nvidia-smi -L' lists no GPU")
else
  say "nvidia-smi: $(echo "$smi" | grep -c '^GPU ') GPU(s): $(echo "$smi" | grep '^GPU ' | head -n 1)"
fi
probe="${ASP_GPU_CHECK_CUDA_PROBE:-}"
if [ -z "$probe" ] && [ -x "$py" ]; then
  probe="$(quote "$py" -c 'import importlib.util as u, sys
try:
    import torch
except ImportError:
    sys.exit("torch not installed in the venv (bash shell/setup_env.sh gpu,test)")
if not torch.cuda.is_available():
    sys.exit(f"torch.cuda.is_available() is False (torch {torch.__version__}, CUDA build {torch.version.cuda})")
missing = [m for m in ("vllm", "ray") if u.find_spec(m) is None]
if missing:
    sys.exit(f"{missing} not installed in the venv (pip install -e .[gpu,test])")
print(torch.cuda.device_count())')"
fi
if [ -n "$probe" ]; then
  if ! probed="$(bash -c "$probe" 2>&1)"; then
    problems+=("torch.cuda: $(echo "$probed" | tail -n 1)")
  else
    gpus="$(echo "$probed" | tail -n 1 | tr -d '[:space:]')"
    case "$gpus" in
      ''|*[!0-9]*) problems+=("torch.cuda: the probe printed '$gpus', not a device count"); gpus=0 ;;
      0) problems+=("torch.cuda: no CUDA device visible (CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset})") ;;
      *) say "torch.cuda: $gpus device(s) visible" ;;
    esac
  fi
fi
command -v timeout >/dev/null 2>&1 || problems+=("timeout: not found on PATH (coreutils)")
if [ "$bench_when" != never ] && [ -z "$bench_cmd" ] && [ ! -f "$config" ]; then
  problems+=("benchmark config: $config not found (set ASP_GPU_CHECK_CONFIG, or --bench never)")
fi
if [ "${#problems[@]}" -gt 0 ]; then
  for p in "${problems[@]}"; do echo "[gpu-check] precondition failed: $p" >&2; done
  echo "[gpu-check] FAILED: ${#problems[@]} precondition(s) not met, nothing was run" >&2
  exit 2
fi
mkdir -p "$out/logs" || { echo "[gpu-check] cannot create $out/logs" >&2; exit 2; }
say "logs in $out/logs"

# ------------------------------------------------------------------------------------------ steps
summary=()
failed=0
record() { summary+=("$(printf '  %-10s %-4s %s' "$1" "$2" "$3")"); }

run_step() {  # name timeout command -> 0 or the failure's code; output to the terminal and logs/<name>.log
  local name="$1" limit="$2" cmd="$3" rc t0=$SECONDS
  say "step $name (timeout ${limit} s): $cmd"
  timeout --kill-after=20 "$limit" bash -c "$cmd" 2>&1 | tee "$out/logs/$name.log"
  rc=${PIPESTATUS[0]}
  step_seconds=$((SECONDS - t0))
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    step_note="timed out after ${limit} s"
  elif [ "$rc" -ne 0 ]; then
    step_note="exit code $rc"
  else
    step_note=""
  fi
  return "$rc"
}

junit_counts() {  # junit XML -> "passed failed skipped" (exit 1 if unreadable)
  "$py" - "$1" <<'EOF'
import sys
import xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
total = sum(int(s.get("tests", 0)) for s in suites)
bad = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
skipped = sum(int(s.get("skipped", 0)) for s in suites)
print(total - bad - skipped, bad, skipped)
EOF
}

bench_verdict() {  # results JSON -> one line; exit 1 unless complete
  "$py" - "$1" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
ratios = ", ".join(f"{m} {r['mean']:.2f}x" for m, r in d.get("ratios_vs_stock", {}).items())
line = f"seeds {d.get('seeds_done')} of {d.get('seeds_planned')}; e2e_tps vs stock: {ratios or 'n/a'}"
print(line)
sys.exit(0 if d.get("complete") else 1)
EOF
}

stop_now() { [ "$failed" -ne 0 ] && [ "$keep_going" = 0 ]; }

# 1. the GPU tier of the tests
if [ -n "$tests_cmd" ]; then
  if run_step gpu-tests "$tests_timeout" "$tests_cmd"; then
    record gpu-tests PASS "(${step_seconds} s)"
  else
    record gpu-tests FAIL "$step_note (${step_seconds} s)"; failed=1
  fi
elif [ "${#gpu_files[@]}" -eq 0 ]; then
  record gpu-tests FAIL "no test module with pytest.mark.gpu under tests/"; failed=1
else
  rm -f "$out/gpu_tests.xml"
  run_step gpu-tests "$tests_timeout" "$(tests_cmd_default)"
  rc=$?
  if counts="$(junit_counts "$out/gpu_tests.xml" 2>/dev/null)"; then
    read -r n_pass n_bad n_skip <<<"$counts"
    note="$n_pass passed, $n_bad failed, $n_skip skipped (${step_seconds} s)"
  else
    n_pass=0; note="no junit results"
  fi
  if [ "$rc" -ne 0 ]; then
    record gpu-tests FAIL "$step_note; $note"; failed=1
  elif [ "$n_pass" -lt 1 ]; then
    record gpu-tests FAIL "no GPU test passed: $note (reasons in $out/logs/gpu-tests.log)"; failed=1
  else
    record gpu-tests PASS "$note"
  fi
fi

# 2. the long-tail benchmark
instances="${ASP_GPU_CHECK_INSTANCES:-$(( gpus - 1 > 2 ? 2 : (gpus - 1 < 1 ? 1 : gpus - 1) ))}"
if stop_now; then
  record benchmark "-" "not run (an earlier step failed; --keep-going runs it anyway)"
elif [ "$bench_when" = never ]; then
  record benchmark SKIP "--bench never"
elif [ "$bench_when" = auto ] && [ "$gpus" -lt 2 ]; then
  record benchmark SKIP "$gpus GPU visible: the NCCL weight-sync group needs the trainer and each instance on separate devices (--bench always tries anyway)"
elif [ -n "$bench_cmd" ]; then
  if run_step benchmark "$bench_timeout" "$bench_cmd"; then
    record benchmark PASS "(${step_seconds} s)"
  else
    record benchmark FAIL "$step_note (${step_seconds} s)"; failed=1
  fi
else
  rm -f "$results"
  if run_step benchmark "$bench_timeout" "$(bench_cmd_default "$instances")"; then
    if verdict="$(bench_verdict "$results" 2>&1)"; then
      record benchmark PASS "$instances instance(s); $verdict -> $results (${step_seconds} s)"
    else
      record benchmark FAIL "incomplete: $(echo "$verdict" | tail -n 1) (a run failed: see $out/logs/benchmark.log)"
      failed=1
    fi
  else
    record benchmark FAIL "$step_note (${step_seconds} s)"; failed=1
  fi
fi

echo "[gpu-check] summary ($((SECONDS - t_start)) s):"
printf '%s\n' "${summary[@]}"
if [ "$failed" -ne 0 ]; then
  echo "[gpu-check] FAILED (logs in $out/logs)"
  exit 1
fi
echo "[gpu-check] OK"

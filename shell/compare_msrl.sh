#!/usr/bin/env bash
# Stock MindSpeed-RL vs ASP on the same data, seeds, iterations and NPU count, then `asp compare`.
#
# Usage, on each node (same as the launch scripts):
#   MINDSPEED_RL_ROOT=... MASTER_ADDR=<node 0 ip> NODE_RANK=<i> NNODES=<n> NPUS_PER_NODE=<16|8> \
#     bash shell/compare_msrl.sh qwen25_7b_A3_asp [ITERS]
# Phase 1 runs MindSpeed-RL's own config (e.g. configs/grpo_qwen25_7b_A3.yaml in its tree) with its own
# runtime_env env vars (no ASP patches; HCCL_IF_BASE_PORT / LCAL_COMM_ID left to this environment, as for
# ASP) on all launched NPUs; phase 2 runs the ASP config. Both use the config's seed, shuffling and ITERS
# iterations (default 20): iteration i holds the same prompts in both runs, because the plan's windows follow
# the loader's seeded draw order. Node 0 ends with `asp compare stock.log asp.log`.
set -euo pipefail
# shellcheck source=msrl_common.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/msrl_common.sh"

config="${1:?usage: compare_msrl.sh <asp config name> [iters]}"
iters="${2:-20}"
case "$config" in
  qwen25_7b_A3_asp) stock=grpo_qwen25_7b_A3; entry=cli/train_grpo.py; nn=1; npn=16 ;;
  qwen25_32b_A3_asp) stock=grpo_qwen25_32b_A3; entry=cli/train_grpo.py; nn=2; npn=16 ;;
  qwen25_32b_A2_asp) stock=grpo_qwen25_32b_A2; entry=cli/train_grpo.py; nn=4; npn=8 ;;
  qwen3_8b_A3_asp) stock=grpo_qwen3_8b_A3; entry=cli/train_grpo.py; nn=1; npn=16 ;;
  qwen3_30b_a3b_dapo_A3_asp) stock=dapo_qwen3_30b_a3b_A3; entry=cli/train_dapo.py; nn=1; npn=16 ;;
  *) die "no stock MindSpeed-RL config known for $config" ;;
esac
export NNODES="${NNODES:-$nn}"
NPUS_PER_NODE="${NPUS_PER_NODE:-$npn}"
export TRAIN_ITERS="$iters"
export ASP_RESUME="${ASP_RESUME:-off}"  # a comparison is two fresh runs of the same iterations
asp_prepare "$config"
base_port="${RAY_PORT:-6766}"
compare_dir="$RUN_DIR/compare"
mkdir -p "$compare_dir"

# ---- phase 1: stock MindSpeed-RL on the same number of NPUs ASP uses in total
RAY_PORT="$base_port"
if [ "$NODE_RANK" = "0" ]; then
  asp_start_ray "$NPUS_PER_NODE"
  asp_wait_nodes "$NNODES"
  # MindSpeed-RL's runtime env vars minus the ones two jobs on one node must not share (no hook: stock code)
  stock_env="$compare_dir/stock_runtime_env.yaml"
  "$PY" - "$MINDSPEED_RL_ROOT/configs/envs/runtime_env.yaml" "$stock_env" <<'PYEOF'
import sys, yaml
env = yaml.safe_load(open(sys.argv[1]))
for key in ("HCCL_IF_BASE_PORT", "LCAL_COMM_ID"):
    env["env_vars"].pop(key, None)
yaml.safe_dump(env, open(sys.argv[2], "w"))
PYEOF
  log "phase 1: stock MindSpeed-RL $stock, $iters iterations on $ASP_TOTAL_NPUS NPUs"
  stock_cmd=("$PY" "$entry" --config-name "$stock" "megatron_training.train_iters=$iters"
             "megatron_training.seed=$ASP_SEED" "rl_config.actor_resource.num_npus=$ASP_TOTAL_NPUS"
             "rl_config.runtime_env_path=$stock_env" "hydra.run.dir=$compare_dir/hydra_stock")
  if dry_run; then
    show_cmd env "RAY_ADDRESS=$RAY_ADDRESS" "${stock_cmd[@]}"
  else
    (cd "$MINDSPEED_RL_ROOT" && "${stock_cmd[@]}") 2>&1 | tee "$compare_dir/stock.log"
  fi
  asp_stop_own_ray
else
  asp_start_ray "$NPUS_PER_NODE"; dry_run || wait "$RAY_PID" || true
fi

# ---- phase 2: ASP
RAY_PORT=$((base_port + 1))
RAY_PID=""
if [ "$NODE_RANK" = "0" ]; then
  asp_start_ray "$NPUS_PER_NODE"
  asp_build_plan
  asp_wait_nodes "$NNODES"
  asp_train "$entry"
  dry_run && exit 0
  cp "$RUN_DIR/train.log" "$compare_dir/asp.log"
  asp_stop_own_ray
  "$PY" -m mindspeed_asp.cli compare "$compare_dir/stock.log" "$compare_dir/asp.log" \
      --json "$compare_dir/compare.json"
else
  asp_start_ray "$NPUS_PER_NODE"; dry_run || wait "$RAY_PID" || true
fi

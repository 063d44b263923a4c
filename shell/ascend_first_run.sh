#!/usr/bin/env bash
# What only hardware can tell, in one short run on one node, before a long run: HCCL weight groups and one
# sync's bandwidth, the functional weight probe after every sync, vllm-ascend's vs Megatron's log-probs at lag 0,
# ASP's patches live after initialize_megatron in every Megatron worker, trainer peak memory across export and
# update, engine build time against its deadline, and ASP's state written beside the checkpoint. Prints a
# pass/fail table with the numbers (mindspeed_asp/integrations/mindspeed_rl/first_run_report.py) and exits 1
# when a check fails.
#
# Usage (one node; the config's NPUs must fit on it):
#   MINDSPEED_RL_ROOT=/path/to/MindSpeed-RL bash shell/ascend_first_run.sh qwen25_7b_A3_asp [hydra overrides]
# Environment: FIRST_RUN_ITERS [3] iterations (the first has lag 0 only, later ones lag <= max_lag),
#   RUN_DIR [runs/first_run_<config>] (its ckpt/ receives the one checkpoint of the last iteration),
#   NPUS_PER_NODE [16], ASP_MIN_SYNC_GBPS [1.0], ASP_DEVICE_MEMORY_GIB [64], and the launch scripts' variables.
# shellcheck source=msrl_common.sh source-path=SCRIPTDIR
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/msrl_common.sh"

config="${1:?usage: ascend_first_run.sh <asp config name> [hydra overrides]}"; shift
export NNODES=1 NODE_RANK=0
export RUN_DIR="${RUN_DIR:-$asp_root/runs/first_run_${config%_asp}}"
export TRAIN_ITERS="${FIRST_RUN_ITERS:-3}"
export ASP_RESUME=off  # always a fresh short run
mkdir -p "$RUN_DIR"
audit="$RUN_DIR/first_run_audit.jsonl"
rm -f "$audit"
asp_prepare "$config" "++asp.audit_path=$audit" "++asp.weight_probe_every=1" "++actor_config.save=$RUN_DIR/ckpt" \
    "++megatron_training.save_interval=$TRAIN_ITERS" "$@"
case "$ASP_MODE" in
  asp|async) ;;
  *) die "$config runs asp.mode $ASP_MODE: the first-run checks need ASP's trainer and rollout pool (asp or async)" ;;
esac
npus="${NPUS_PER_NODE:-16}"
[ "$ASP_TOTAL_NPUS" -le "$npus" ] || die "$config needs $ASP_TOTAL_NPUS NPUs; the first run uses one node of $npus"
asp_start_ray "$npus"
asp_build_plan
asp_wait_nodes 1
asp_train "$(case "$config" in *dapo*) echo cli/train_dapo.py ;; *) echo cli/train_grpo.py ;; esac)"
dry_run && exit 0
asp_stop_own_ray
log "first-run checks ($TRAIN_ITERS iterations, log $RUN_DIR/train.log)"
"$PY" -m mindspeed_asp.integrations.mindspeed_rl.first_run_report --log "$RUN_DIR/train.log" --audit "$audit" \
    --trainer-ranks "$ASP_TRAIN_NPUS" --probe-tolerance "$ASP_PROBE_TOLERANCE" \
    --min-sync-gbps "${ASP_MIN_SYNC_GBPS:-1.0}" --device-memory-gib "${ASP_DEVICE_MEMORY_GIB:-64}" \
    --save-dir "$RUN_DIR/ckpt" --train-iters "$TRAIN_ITERS" --json "$RUN_DIR/first_run.json"

#!/usr/bin/env bash
# Shared launch logic for ASP runs inside MindSpeed-RL on Ascend (sourced by shell/<config>.sh).
#
# Run the same script, with the same arguments, on every node, from anywhere:
#   MINDSPEED_RL_ROOT=/path/to/MindSpeed-RL MASTER_ADDR=<head ip> NODE_RANK=<0..NNODES-1> \
#     bash shell/<config>.sh [hydra overrides, e.g. rl_config.n_samples_per_prompt=16 asp.max_lag=2]
# Every node first composes configs/<config>.yaml with the overrides (Hydra's compose API) into
# RUN_DIR/config/<config>.yaml, the one file MindSpeed-RL and every ASP process then read. Node 0 starts the
# Ray head, builds the dispatch plan (`asp plan`) while the others join, and runs training; the other nodes
# join the head, retrying until ASP_JOIN_TIMEOUT.
# Unlike MindSpeed-RL's examples this never runs `pkill -9 python` or `ray stop`: it stops only the Ray
# processes it started itself (their `ray start --block` parent), so other users' jobs are left alone.
#
# Environment (defaults in brackets):
#   MINDSPEED_RL_ROOT   MindSpeed-RL checkout at 05a90d7 (with mindspeed/, megatron/, mindspeed_llm/ copied in)
#   MASTER_ADDR [this host]  NODE_RANK [0]  RAY_PORT [6766]  RUN_DIR [runs/<config>]  TRAIN_ITERS [config's]
#   NODE_IP [node 0: MASTER_ADDR; others: the source address of the route to MASTER_ADDR]  this node's address
#     for Ray (--node-ip-address) and the default NIC below
#   ASP_SOCKET_IFNAME [the interface holding NODE_IP]  exported as HCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME and
#     TP_SOCKET_IFNAME unless those are set; required (with NODE_IP) on multi-node runs
#   ASP_PROMPTS [RUN_DIR/prompts.jsonl, exported from the MindSpeed-RL dataset when absent]
#   ASP_HISTORY (length history for the estimator)  ASP_COST (cost model JSON from `asp fit-cost`)
#   HCCL_IF_BASE_PORT [64000]  LCAL_COMM_ID [127.0.0.1:27001]  (give concurrent jobs on a node distinct values:
#     runtime_env.yaml does not override them, Ray workers inherit them from `ray start`)
#   HCCL_CONNECT_TIMEOUT [1800]  HCCL_EXEC_TIMEOUT [3600]  HCCL_BUFFSIZE [256]
#   ASCEND_TOOLKIT_HOME [/usr/local/Ascend/ascend-toolkit/latest]
#   ASP_RESUME [auto]  auto: when actor_config.save holds a checkpoint with ASP's state, the run resumes it
#     (load from save; finetune, no_load_optim, no_load_rng false); off: the config as written (a start that
#     would discard a saved ASP state is refused by the driver unless asp.ignore_saved_state: true)
#   ASP_JOIN_TIMEOUT [1800]  seconds a node keeps trying to join the head (node 0 waits as long for them)
#   ASP_DRY_RUN=1  validate and prepare, then print the plan, `ray start` and training commands (with the
#     network environment) instead of running them
#
# RAY_ADDRESS is exported (MASTER_ADDR:RAY_PORT) once this script's Ray node is started, so MindSpeed-RL's
# bare `ray.init()` joins this cluster and never another user's on the same machine.

set -euo pipefail

asp_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${ASP_PYTHON:-python3}"

die() { echo "[asp] error: $*" >&2; exit 2; }
log() { echo "[asp $(date -u +%H:%M:%S) node ${NODE_RANK:-0}] $*" >&2; }
dry_run() { [ "${ASP_DRY_RUN:-0}" = "1" ]; }
show_cmd() { printf '[asp dry-run]'; printf ' %q' "$@"; printf '\n'; }

asp_env() {
  # The environment MindSpeed-RL's examples set, without their process killing.
  local toolkit="${ASCEND_TOOLKIT_HOME:-/usr/local/Ascend/ascend-toolkit/latest}" cann_env=""
  # CANN <= 8.3: ascend-toolkit/set_env.sh; CANN 8.5 (MindSpeed-RL's install guide): /usr/local/Ascend/cann
  for f in "$toolkit/../set_env.sh" /usr/local/Ascend/ascend-toolkit/set_env.sh /usr/local/Ascend/cann/set_env.sh; do
    if [ -f "$f" ]; then cann_env="$f"; break; fi
  done
  if [ -n "$cann_env" ] && [ -z "${ASCEND_HOME_PATH:-}" ]; then
    set +u
    # shellcheck disable=SC1090
    source "$cann_env"
    set -u
  fi
  if [ -f /usr/local/Ascend/nnal/atb/set_env.sh ] && [ -z "${ATB_HOME_PATH:-}" ]; then
    set +u
    # shellcheck disable=SC1091
    source /usr/local/Ascend/nnal/atb/set_env.sh
    set -u
  fi
  export TASK_QUEUE_ENABLE="${TASK_QUEUE_ENABLE:-2}"
  export HCCL_IF_BASE_PORT="${HCCL_IF_BASE_PORT:-64000}"
  export HCCL_CONNECT_TIMEOUT="${HCCL_CONNECT_TIMEOUT:-1800}"
  export HCCL_EXEC_TIMEOUT="${HCCL_EXEC_TIMEOUT:-3600}"
  export HCCL_BUFFSIZE="${HCCL_BUFFSIZE:-256}"
  export VLLM_ASCEND_ENABLE_NZ=0   # ASP loads synced weights in ND layout
  export RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES=true
  export LCAL_COMM_ID="${LCAL_COMM_ID:-127.0.0.1:27001}"  # per node; not overridden by runtime_env.yaml
  export CUDA_DEVICE_MAX_CONNECTIONS=1
  export HYDRA_FULL_ERROR=1
  # dozens of actors, each with TCPStores and HCCL sockets (stock's examples raise it to 32768)
  ulimit -n "$(ulimit -Hn)" 2>/dev/null || log "could not raise the open-file limit (ulimit -n $(ulimit -n))"
  local jemalloc
  jemalloc="$(find /usr/lib /usr/local/lib -maxdepth 2 -name libjemalloc.so.2 2>/dev/null | head -n 1 || true)"
  if [ -n "$jemalloc" ]; then export LD_PRELOAD="${jemalloc}${LD_PRELOAD:+:$LD_PRELOAD}"; fi
}

asp_prepare() {
  # $1 = config name (file in configs/ without .yaml); the rest: the launch line's Hydra overrides
  CONFIG="$1"; shift
  local source_file="$asp_root/configs/$CONFIG.yaml"
  [ -f "$source_file" ] || die "no config $source_file"
  [ -n "${MINDSPEED_RL_ROOT:-}" ] || die "set MINDSPEED_RL_ROOT to the MindSpeed-RL checkout (05a90d7)"
  [ -d "$MINDSPEED_RL_ROOT/mindspeed_rl" ] || die "$MINDSPEED_RL_ROOT is not a MindSpeed-RL checkout"
  NODE_RANK="${NODE_RANK:-0}"
  MASTER_ADDR="${MASTER_ADDR:-$(hostname -I | awk '{print $1}')}"
  RAY_PORT="${RAY_PORT:-6766}"
  RUN_DIR="$(mkdir -p "${RUN_DIR:-$asp_root/runs/${CONFIG%_asp}}" && cd "${RUN_DIR:-$asp_root/runs/${CONFIG%_asp}}" && pwd)"
  export MINDSPEED_RL_SRC="$MINDSPEED_RL_ROOT"
  # Ray runs the worker setup hook before it puts the driver's paths on sys.path: every node's `ray start`
  # must already see MindSpeed-RL (the hook also prepends MINDSPEED_RL_SRC itself)
  export PYTHONPATH="$MINDSPEED_RL_ROOT${PYTHONPATH:+:$PYTHONPATH}"
  export ASP_PLAN="${ASP_PLAN:-$RUN_DIR/plan.parquet}"  # the YAML's ${oc.env:ASP_PLAN}, as validated below
  # The overrides (and TRAIN_ITERS) composed into one file: MindSpeed-RL and ASP read the same values. The same
  # Python process validates it and prints the only variables this script reads (config_section.SHELL_VARS):
  # every other setting reaches each process through the file.
  local composed overrides=()
  if [ -n "${TRAIN_ITERS:-}" ]; then overrides+=("megatron_training.train_iters=$TRAIN_ITERS"); fi
  overrides+=("$@")
  composed="$("$PY" -m mindspeed_asp.integrations.mindspeed_rl.launch_config "$source_file" "$RUN_DIR/config" \
              --msrl-root "$MINDSPEED_RL_ROOT" --resume "${ASP_RESUME:-auto}" -- "${overrides[@]}")" || exit 2
  # ASP_COMPOSED_CONFIG, ASP_HYDRA_ARGS, ASP_MODE, ASP_TOTAL_NPUS, ASP_TRAIN_NPUS, ASP_TRAIN_ITERS, ASP_SEED,
  # ASP_PROBE_TOLERANCE
  eval "$composed"
  CONFIG_FILE="$ASP_COMPOSED_CONFIG"
  CONFIG_DIR="$(dirname "$CONFIG_FILE")"
  [ "${#overrides[@]}" -eq 0 ] || log "composed $CONFIG with ${overrides[*]} into $CONFIG_FILE"
  export ASP_MSRL_CONFIG="$CONFIG_FILE"
  ASP_RUNTIME_ENV="$("$PY" -m mindspeed_asp.integrations.mindspeed_rl.setup_hook)"
  export ASP_RUNTIME_ENV
  export ASP_RAY_NAMESPACE="${ASP_RAY_NAMESPACE:-asp_${CONFIG}}"
  TRAIN_ITERS="$ASP_TRAIN_ITERS"  # the composed file's (TRAIN_ITERS, when set, was composed into it)
  # Refuse another MindSpeed-RL commit unless ASP_ALLOW_UNPINNED_MINDSPEED_RL=1.
  "$PY" -c "
import sys
from mindspeed_asp.integrations.mindspeed_rl.pins import PinMismatchError, check_mindspeed_rl_commit
try:
    print('[asp] MindSpeed-RL', check_mindspeed_rl_commit()[:10])
except PinMismatchError as exc:
    sys.exit(str(exc))" || die "MindSpeed-RL pin check failed"
  asp_env
}

asp_network() {
  # This node's address and NICs, exported before `ray start` (Ray workers inherit them; runtime_env.yaml
  # leaves them alone). Multi-node runs need both found or given; one node falls back to HCCL's own choice.
  local nnodes="${NNODES:-1}"
  if [ -z "${NODE_IP:-}" ]; then
    if [ "$NODE_RANK" = "0" ]; then
      NODE_IP="$MASTER_ADDR"
    else
      NODE_IP="$(ip route get "$MASTER_ADDR" 2>/dev/null | awk '{for (i = 1; i < NF; i++) if ($i == "src") {print $(i + 1); exit}}' || true)"
    fi
  fi
  [ -n "$NODE_IP" ] || die "cannot tell this node's IP towards MASTER_ADDR=$MASTER_ADDR (no route or no \`ip\`): set NODE_IP"
  export NODE_IP
  local ifname="${ASP_SOCKET_IFNAME:-}"
  if [ -z "$ifname" ]; then
    ifname="$(ip -o -4 addr show 2>/dev/null | awk -v ip="$NODE_IP" '{split($4, a, "/"); if (a[1] == ip) {print $2; exit}}' || true)"
  fi
  if [ -z "$ifname" ]; then
    [ "$nnodes" -le 1 ] || die "cannot find the network interface holding NODE_IP=$NODE_IP: set ASP_SOCKET_IFNAME (HCCL, Gloo and TP bind to it across nodes)"
    log "no interface found for $NODE_IP: HCCL/Gloo pick their own (single node)"
    return 0
  fi
  export HCCL_SOCKET_IFNAME="${HCCL_SOCKET_IFNAME:-$ifname}"
  export GLOO_SOCKET_IFNAME="${GLOO_SOCKET_IFNAME:-$ifname}"
  export TP_SOCKET_IFNAME="${TP_SOCKET_IFNAME:-$ifname}"
}

asp_show_env() {
  # The environment Ray workers on this node inherit for communication (logged; printed in dry runs).
  local line="NODE_IP=${NODE_IP:-} HCCL_SOCKET_IFNAME=${HCCL_SOCKET_IFNAME:-} GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-}"
  line+=" TP_SOCKET_IFNAME=${TP_SOCKET_IFNAME:-} HCCL_IF_BASE_PORT=${HCCL_IF_BASE_PORT:-} LCAL_COMM_ID=${LCAL_COMM_ID:-}"
  line+=" RAY_ADDRESS=${RAY_ADDRESS:-} RAY_AUTH_MODE=${RAY_AUTH_MODE:-}"
  if dry_run; then echo "[asp dry-run] env $line"; else log "env $line"; fi
}

asp_build_plan() {
  # Head node only: the plan must exist before training starts (modes asp and colocated follow it).
  case "$ASP_MODE" in asp|colocated) ;; *) return 0 ;; esac
  local prompts="${ASP_PROMPTS:-$RUN_DIR/prompts.jsonl}"
  local export_cmd=("$PY" -m mindspeed_asp.integrations.mindspeed_rl.export_prompts --config "$CONFIG_FILE"
                    -o "$prompts" --train-iters "$TRAIN_ITERS")
  if [ ! -f "$prompts" ]; then
    log "exporting the MindSpeed-RL prompt dataset to $prompts (in the loader's draw order)"
    if dry_run; then show_cmd "${export_cmd[@]}"; else (cd "$MINDSPEED_RL_ROOT" && "${export_cmd[@]}"); fi
  fi
  # `asp plan` reads the composed training YAML itself: the instances that follow the plan, slots, batch
  # (= one plan window), n, max tokens, seed, max_lag, KV budget, planner, estimator and cost all come from it.
  local args=(--dataset "$prompts" --config "$CONFIG_FILE" --json "$RUN_DIR/plan_summary.json" -o "$ASP_PLAN")
  if [ -n "${ASP_HISTORY:-}" ]; then args+=(--history "$ASP_HISTORY"); fi
  if [ -n "${ASP_COST:-}" ]; then args+=(--cost "$ASP_COST"); fi
  log "building the dispatch plan: asp plan ${args[*]}"
  if dry_run; then show_cmd "$PY" -m mindspeed_asp.cli plan "${args[@]}"; return 0; fi
  "$PY" -m mindspeed_asp.cli plan "${args[@]}"
}

RAY_PID=""
asp_stop_own_ray() {
  if [ -n "$RAY_PID" ] && kill -0 "$RAY_PID" 2>/dev/null; then
    log "stopping the Ray node this script started (pid $RAY_PID)"
    kill -TERM "$RAY_PID" 2>/dev/null || true
    wait "$RAY_PID" 2>/dev/null || true
  fi
}

asp_ray_cli() {
  # The `ray` CLI of $PY's environment (the Ray the job imports), never another one found first on PATH.
  printf '%s\n' "$PY" -m ray.scripts.scripts
}

asp_ray_auth() {
  # Ray 2.60: `ray start --head` turns token authentication on by itself when a token exists on the head
  # (~/.ray/auth_token), but `ray start --address` and drivers do not, so a joining node is refused with
  # InvalidAuthToken. Decide once per node, explicitly, for every Ray process this script starts.
  if [ -z "${RAY_AUTH_MODE:-}" ]; then
    if [ -n "${RAY_AUTH_TOKEN:-}" ] || [ -f "${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}" ]; then
      export RAY_AUTH_MODE=token
    else
      export RAY_AUTH_MODE=disabled
    fi
  fi
}

asp_start_ray() {
  # $1 = NPUs on this node. `ray start --block` runs in a background job of its own; killing it shuts down
  # exactly the Ray processes it started. Ray workers inherit this shell's environment. Returns once the
  # node is up (its log says "Ray runtime started"); worker nodes wait for the head first and retry a
  # failed join until ASP_JOIN_TIMEOUT. The node's log: RUN_DIR/ray_node<NODE_RANK>.log.
  local npus="$1"
  asp_network
  asp_ray_auth
  trap asp_stop_own_ray EXIT INT TERM
  local cmd ray_cli
  mapfile -t ray_cli < <(asp_ray_cli)
  if [ "$NODE_RANK" = "0" ]; then
    if ! dry_run && "$PY" -c "import socket; socket.create_connection(('$MASTER_ADDR', $RAY_PORT), 3).close()" 2>/dev/null; then
      die "something (a Ray cluster: someone else's?) already listens on $MASTER_ADDR:$RAY_PORT; pick another RAY_PORT"
    fi
    cmd=("${ray_cli[@]}" start --head --port "$RAY_PORT" --node-ip-address "$NODE_IP"
         --resources="{\"NPU\": $npus}" --include-dashboard=false --block)
  else
    cmd=("${ray_cli[@]}" start --address="$MASTER_ADDR:$RAY_PORT" --node-ip-address "$NODE_IP"
         --resources="{\"NPU\": $npus}" --block)
  fi
  export RAY_ADDRESS="$MASTER_ADDR:$RAY_PORT"  # MindSpeed-RL's bare ray.init() joins this cluster, no other
  asp_show_env
  if dry_run; then
    show_cmd env -u RAY_ADDRESS "${cmd[@]}"
    RAY_PID=""
    return 0
  fi
  [ "$NODE_RANK" = "0" ] || asp_wait_head
  local node_log="$RUN_DIR/ray_node${NODE_RANK}.log" start=$SECONDS limit="${ASP_JOIN_TIMEOUT:-1800}" attempt=0
  while :; do
    attempt=$((attempt + 1))
    (cd "$MINDSPEED_RL_ROOT" && exec env -u RAY_ADDRESS "${cmd[@]}") >"$node_log" 2>&1 &
    RAY_PID=$!
    while kill -0 "$RAY_PID" 2>/dev/null && ! grep -q "Ray runtime started" "$node_log"; do sleep 1; done
    if kill -0 "$RAY_PID" 2>/dev/null; then
      log "Ray node up ($([ "$NODE_RANK" = "0" ] && echo head || echo "joined $MASTER_ADDR:$RAY_PORT"), attempt $attempt, log $node_log)"
      return 0
    fi
    wait "$RAY_PID" 2>/dev/null || true
    RAY_PID=""
    [ "$NODE_RANK" != "0" ] || die "ray start --head failed (log $node_log): $(tail -n 5 "$node_log" | tr '\n' ' ')"
    if grep -q "InvalidAuthToken\|Authentication token is missing" "$node_log"; then
      die "the Ray head $MASTER_ADDR:$RAY_PORT uses token authentication and refuses this node's token (RAY_AUTH_MODE=$RAY_AUTH_MODE): copy node 0's ~/.ray/auth_token here (or set RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH), or start every node with RAY_AUTH_MODE=disabled"
    fi
    [ $((SECONDS - start)) -lt "$limit" ] || die "could not join the Ray head $MASTER_ADDR:$RAY_PORT within ${limit} s (ASP_JOIN_TIMEOUT, $attempt attempts; log $node_log): $(tail -n 5 "$node_log" | tr '\n' ' ')"
    log "joining $MASTER_ADDR:$RAY_PORT failed (attempt $attempt): $(tail -n 2 "$node_log" | tr '\n' ' '); retrying"
    sleep 5
    asp_wait_head
  done
}

asp_wait_nodes() {
  # $1 = expected node count; bounded by ASP_JOIN_TIMEOUT, naming how many joined
  local want="$1" have=0 start=$SECONDS limit="${ASP_JOIN_TIMEOUT:-1800}"
  dry_run && return 0
  while :; do
    have="$("$PY" -c "import ray; ray.init(address='$MASTER_ADDR:$RAY_PORT', logging_level='ERROR'); print(sum(n['Alive'] for n in ray.nodes()))" 2>/dev/null || echo 0)"
    log "Ray nodes alive: $have / $want"
    [ "$have" -lt "$want" ] || return 0
    [ $((SECONDS - start)) -lt "$limit" ] || die "only $have of $want Ray nodes joined $MASTER_ADDR:$RAY_PORT within ${limit} s (ASP_JOIN_TIMEOUT): start the script on every node, with NODE_RANK 1..$((want - 1))"
    sleep 5
  done
}

asp_wait_head() {
  # Worker nodes: wait (bounded by ASP_JOIN_TIMEOUT) until the head's GCS port accepts connections, so a
  # `ray start --address` is never spent against a head that is not up yet (node 0 may still be starting).
  local start=$SECONDS limit="${ASP_JOIN_TIMEOUT:-1800}"
  dry_run && return 0
  until "$PY" -c "import socket,sys; socket.create_connection(('$MASTER_ADDR', $RAY_PORT), 3).close()" 2>/dev/null; do
    [ $((SECONDS - start)) -lt "$limit" ] || die "the Ray head $MASTER_ADDR:$RAY_PORT did not come up within ${limit} s (ASP_JOIN_TIMEOUT): is node 0 running this script, and is MASTER_ADDR its address?"
    sleep 2
  done
}

asp_train() {
  # $1 = MindSpeed-RL entry script (cli/train_grpo.py or cli/train_dapo.py). The config overrides were
  # composed into CONFIG_FILE by asp_prepare; only Hydra's own (hydra.*) stay on this line, and any other
  # argument here is refused: it would reach MindSpeed-RL but not ASP.
  local entry="$1"; shift
  local extra
  for extra in "$@"; do
    case "$extra" in hydra.*|hydra/*|+hydra.*|++hydra.*) ;; *) die "asp_train: config override $extra must go to asp_prepare (composed for MindSpeed-RL and ASP alike)" ;; esac
  done
  [ -n "${RAY_ADDRESS:-}" ] || die "RAY_ADDRESS unset: start this script's Ray node first (asp_start_ray)"
  local cmd=("$PY" "$entry" --config-path "$CONFIG_DIR" --config-name "$CONFIG"
             "hydra.searchpath=[file://$MINDSPEED_RL_ROOT/configs]" "hydra.run.dir=$RUN_DIR/hydra"
             "${ASP_HYDRA_ARGS[@]}" "$@")
  log "training: $entry --config-name $CONFIG on Ray $RAY_ADDRESS (log: $RUN_DIR/train.log)"
  if dry_run; then show_cmd env "RAY_ADDRESS=$RAY_ADDRESS" "${cmd[@]}"; return 0; fi
  (cd "$MINDSPEED_RL_ROOT" && "${cmd[@]}") 2>&1 | tee "$RUN_DIR/train.log"
}

asp_launch() {
  # asp_launch CONFIG NNODES NPUS_PER_NODE ENTRY [hydra overrides...]: the same line on every node
  local config="$1" nnodes="$2" npus="$3" entry="$4"; shift 4
  NNODES="$nnodes"
  asp_prepare "$config" "$@"
  local need=$((nnodes * npus))
  [ "$ASP_TOTAL_NPUS" -le "$need" ] || die "$config needs $ASP_TOTAL_NPUS NPUs but $nnodes x $npus = $need are launched"
  if [ "$NODE_RANK" = "0" ]; then
    asp_start_ray "$npus"  # first: the other nodes join while the prompts export and the plan builds
    asp_build_plan
    asp_wait_nodes "$nnodes"
    asp_train "$entry"
  else
    asp_start_ray "$npus"
    dry_run && return 0
    log "joined $MASTER_ADDR:$RAY_PORT; waiting (Ctrl-C or the head's shutdown ends this node)"
    wait "$RAY_PID"
  fi
}

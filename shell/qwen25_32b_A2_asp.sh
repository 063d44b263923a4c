#!/usr/bin/env bash
# ASP launch: Qwen2.5-32B GRPO, 4 A2 nodes (16 NPUs train, 8 instances x TP2).
# Usage, on each of the 4 node(s):
#   MINDSPEED_RL_ROOT=/path/to/MindSpeed-RL MASTER_ADDR=<node 0 ip> NODE_RANK=<0..3> bash shell/qwen25_32b_A2_asp.sh [hydra overrides]
# Multi-node: each node's address and NIC are detected from the route to MASTER_ADDR; set NODE_IP and
# ASP_SOCKET_IFNAME where that fails (the script stops and says so). ASP_DRY_RUN=1 prints what it would run.
# See shell/msrl_common.sh for the environment it reads; docs/ascend.md for the cluster this assumes.
set -euo pipefail
# shellcheck source=msrl_common.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/msrl_common.sh"
NNODES="${NNODES:-4}"
NPUS_PER_NODE="${NPUS_PER_NODE:-8}"
asp_launch qwen25_32b_A2_asp "$NNODES" "$NPUS_PER_NODE" cli/train_grpo.py "$@"

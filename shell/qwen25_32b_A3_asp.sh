#!/usr/bin/env bash
# ASP launch: Qwen2.5-32B GRPO, 2 A3 nodes (16 dies train, 8 instances x TP2).
# Usage, on each of the 2 node(s):
#   MINDSPEED_RL_ROOT=/path/to/MindSpeed-RL MASTER_ADDR=<node 0 ip> NODE_RANK=<0..1> bash shell/qwen25_32b_A3_asp.sh [hydra overrides]
# Multi-node: each node's address and NIC are detected from the route to MASTER_ADDR; set NODE_IP and
# ASP_SOCKET_IFNAME where that fails (the script stops and says so). ASP_DRY_RUN=1 prints what it would run.
# See shell/msrl_common.sh for the environment it reads; docs/ascend.md for the cluster this assumes.
set -euo pipefail
# shellcheck source=msrl_common.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/msrl_common.sh"
NNODES="${NNODES:-2}"
NPUS_PER_NODE="${NPUS_PER_NODE:-16}"
asp_launch qwen25_32b_A3_asp "$NNODES" "$NPUS_PER_NODE" cli/train_grpo.py "$@"

#!/usr/bin/env bash
# ASP launch: Qwen2.5-7B GRPO, 1 A3 node (8 dies train, 8 instances x TP1).
# Usage, on each of the 1 node(s):
#   MINDSPEED_RL_ROOT=/path/to/MindSpeed-RL MASTER_ADDR=<node 0 ip> NODE_RANK=<0..0> bash shell/qwen25_7b_A3_asp.sh [hydra overrides]
# See shell/msrl_common.sh for the environment it reads; docs/ascend.md for the cluster this assumes.
set -euo pipefail
# shellcheck source=msrl_common.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/msrl_common.sh"
NNODES="${NNODES:-1}"
NPUS_PER_NODE="${NPUS_PER_NODE:-16}"
asp_launch qwen25_7b_A3_asp "$NNODES" "$NPUS_PER_NODE" cli/train_grpo.py "$@"

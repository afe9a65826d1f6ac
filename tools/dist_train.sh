#!/usr/bin/env bash
# Train with mmseg's stock tools/train.py on the GCU cards of this node, under torchrun:
# `mmgcu train` (mmgcu/cli/launch.py) from this checkout.
#
#   tools/dist_train.sh CONFIG [CARDS] [train.py args...]
#
# CARDS (the 2nd argument, only when it is an integer) defaults to every card of the node,
# counted by mmgcu/launch/cards.py (TOPS_VISIBLE_DEVICES, MMGCU_SIMULATE, efsmi).
# Environment:
#   PYTHON        interpreter to run (default: python, else python3)
#   TRAIN_SCRIPT  training script (default: tools/train.py shipped in the mmseg package)
#   NNODES, NODE_RANK, MASTER_ADDR, PORT
#                 several nodes, as in OpenMMLab's dist_train.sh: run the same command on
#                 each node with its NODE_RANK; MASTER_ADDR is node 0's address.
#                 On one node without PORT, each job gets a rendezvous port of its own
#                 (torch 1.x's torchrun --standalone would always take 29400).
set -euo pipefail

NAME=$(basename "$0")
# shellcheck source=tools/launch_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/launch_common.sh"
exec_launch train "$@"

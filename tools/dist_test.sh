#!/usr/bin/env bash
# Test a checkpoint on the GCU cards of this node, under torchrun: `mmgcu test`
# (mmgcu/cli/launch.py) from this checkout. It runs mmgcu's test entry
# (mmgcu/cli/test_entry.py), which takes mmseg's test.py arguments and, unlike mmseg
# 1.2.2's own test.py, honours runner_type.
#
#   tools/dist_test.sh CONFIG CHECKPOINT [CARDS] [test.py args...]
#
# CARDS (the 3rd argument, only when it is an integer) defaults to every card of the node,
# counted by mmgcu/launch/cards.py (TOPS_VISIBLE_DEVICES, MMGCU_SIMULATE, efsmi).
# Environment:
#   PYTHON        interpreter to run (default: python, else python3)
#   TEST_SCRIPT   test script (default: python -m mmgcu.cli.test_entry)
#   NNODES, NODE_RANK, MASTER_ADDR, PORT
#                 several nodes, as in OpenMMLab's dist_test.sh: run the same command on
#                 each node with its NODE_RANK; MASTER_ADDR is node 0's address.
#                 On one node without PORT, each job gets a rendezvous port of its own
#                 (torch 1.x's torchrun --standalone would always take 29400).
set -euo pipefail

NAME=$(basename "$0")
# shellcheck source=tools/launch_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/launch_common.sh"
exec_launch test "$@"

#!/usr/bin/env bash
# Test a checkpoint with mmseg's stock tools/test.py on the GCU cards of this node, under
# torchrun: the launcher of tools/dist_train.sh, for testing.
#
#   tools/dist_test.sh CONFIG CHECKPOINT [CARDS] [test.py args...]
#
# CARDS (the 3rd argument, only when it is an integer) defaults to every card of the node,
# counted by mmgcu/device/cards.py (TOPS_VISIBLE_DEVICES, MMGCU_SIMULATE, efsmi).
# Environment:
#   PYTHON        interpreter to run (default: python)
#   TEST_SCRIPT   test script (default: mmgcu's tools/test.py: mmseg 1.2.2's own test.py
#                 builds a plain Runner whatever runner_type says, see tools/test.py)
#   NNODES, NODE_RANK, MASTER_ADDR, PORT
#                 several nodes, as in OpenMMLab's dist_test.sh: run the same command on
#                 each node with its NODE_RANK; MASTER_ADDR is node 0's address.
#                 On one node without PORT, torchrun picks a free port itself.
set -euo pipefail

NAME=$(basename "$0")
usage() {
    echo "usage: $NAME CONFIG CHECKPOINT [CARDS] [test.py args...]" >&2
    echo "       (env: PYTHON, TEST_SCRIPT, NNODES, NODE_RANK, MASTER_ADDR, PORT)" >&2
    exit 2
}

# shellcheck source=tools/launch_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/launch_common.sh"

[[ $# -ge 2 && $1 != -* && $2 != -* ]] || usage
CONFIG=$1
CHECKPOINT=$2
shift 2
[[ -f $CONFIG ]] || die "config not found: $CONFIG"
# mmengine also loads checkpoints from URLs.
[[ -f $CHECKPOINT || $CHECKPOINT == *://* ]] || die "checkpoint not found: $CHECKPOINT"

# CARDS is optional, so only an integer 3rd argument is taken for it:
# `dist_test.sh CFG CKPT --work-dir W` forwards --work-dir to test.py.
cards=""
if [[ $# -ge 1 && $1 =~ ^[0-9]+$ ]]; then
    cards=$1
    shift
fi

TEST_SCRIPT=${TEST_SCRIPT:-$REPO/tools/test.py}
[[ -f $TEST_SCRIPT ]] || die "test script not found: $TEST_SCRIPT (set TEST_SCRIPT)"

exec_torchrun "$TEST_SCRIPT" "$CONFIG" "$CHECKPOINT" "$@"

#!/usr/bin/env bash
# Train with mmseg's stock tools/train.py on the GCU cards of this node, under torchrun.
#
#   tools/dist_train.sh CONFIG [CARDS] [train.py args...]
#
# CARDS (the 2nd argument, only when it is an integer) defaults to every card of the node,
# counted by mmgcu/device/cards.py (TOPS_VISIBLE_DEVICES, MMGCU_SIMULATE, efsmi).
# Environment:
#   PYTHON        interpreter to run (default: python)
#   TRAIN_SCRIPT  training script (default: tools/train.py shipped in the mmseg package)
#   NNODES, NODE_RANK, MASTER_ADDR, PORT
#                 several nodes, as in OpenMMLab's dist_train.sh: run the same command on
#                 each node with its NODE_RANK; MASTER_ADDR is node 0's address.
#                 On one node without PORT, torchrun picks a free port itself.
set -euo pipefail

NAME=$(basename "$0")
usage() {
    echo "usage: $NAME CONFIG [CARDS] [train.py args...]" >&2
    echo "       (env: PYTHON, TRAIN_SCRIPT, NNODES, NODE_RANK, MASTER_ADDR, PORT)" >&2
    exit 2
}

# shellcheck source=tools/launch_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/launch_common.sh"

[[ $# -ge 1 && $1 != -* ]] || usage
CONFIG=$1
shift
[[ -f $CONFIG ]] || die "config not found: $CONFIG"

# CARDS is optional, so only an integer 2nd argument is taken for it:
# `dist_train.sh CFG --work-dir W` forwards --work-dir to train.py.
cards=""
if [[ $# -ge 1 && $1 =~ ^[0-9]+$ ]]; then
    cards=$1
    shift
fi

if [[ -z ${TRAIN_SCRIPT:-} ]]; then
    # find_spec locates mmseg without importing it (and torch with it).
    TRAIN_SCRIPT=$("$PYTHON" -c 'import importlib.util as u, os
print(os.path.join(os.path.dirname(u.find_spec("mmseg").origin), ".mim", "tools", "train.py"))') ||
        die "mmseg is not importable by '$PYTHON'; install mmsegmentation or set TRAIN_SCRIPT"
fi
[[ -f $TRAIN_SCRIPT ]] || die "training script not found: $TRAIN_SCRIPT (set TRAIN_SCRIPT)"

exec_torchrun "$TRAIN_SCRIPT" "$CONFIG" "$@"

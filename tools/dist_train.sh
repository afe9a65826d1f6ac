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
die() {
    echo "$NAME: error: $*" >&2
    exit 1
}

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

PYTHON=${PYTHON:-python}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# The checkout first, so custom_imports=['mmgcu'] works without installing mmgcu.
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"

if [[ -z $cards ]]; then
    # Counted without initialising a card, so no card is held by this shell's python.
    # Run as a plain script: it imports neither mmgcu nor torch, so it takes milliseconds.
    counter="$REPO/mmgcu/device/cards.py"
    cards=$("$PYTHON" "$counter") ||
        die "could not count the cards with '$PYTHON $counter'; give CARDS"
    [[ $cards =~ ^[0-9]+$ ]] || die "'$PYTHON $counter' printed '$cards'"
    if ((cards == 0)); then
        die "found no GCU card on this node (TOPS_VISIBLE_DEVICES is unset, no simulator," \
            "and efsmi is missing or lists no card). Check the driver with 'efsmi'," \
            "or give the number of cards: $NAME CONFIG CARDS ..."
    fi
fi
cards=$((10#$cards)) # base 10: "08" is not octal
((cards > 0)) || die "CARDS must be at least 1, got $cards"

if [[ -z ${TRAIN_SCRIPT:-} ]]; then
    # find_spec locates mmseg without importing it (and torch with it).
    TRAIN_SCRIPT=$("$PYTHON" -c 'import importlib.util as u, os
print(os.path.join(os.path.dirname(u.find_spec("mmseg").origin), ".mim", "tools", "train.py"))') ||
        die "mmseg is not importable by '$PYTHON'; install mmsegmentation or set TRAIN_SCRIPT"
fi
[[ -f $TRAIN_SCRIPT ]] || die "training script not found: $TRAIN_SCRIPT (set TRAIN_SCRIPT)"

NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
[[ $NNODES =~ ^[1-9][0-9]*$ ]] || die "NNODES must be a positive integer, got '$NNODES'"
if ! [[ $NODE_RANK =~ ^[0-9]+$ ]] || ((10#$NODE_RANK >= NNODES)); then
    die "NODE_RANK must be in 0..$((NNODES - 1)), got '$NODE_RANK'"
fi
if ((NNODES == 1)) && [[ -z ${PORT:-} ]]; then
    # A rendezvous on a free local port: two jobs on one node do not fight over 29500.
    rendezvous=(--standalone)
else
    # Every node must name the same address and port, so nothing is picked at random here.
    if ((NNODES > 1)) && [[ -z ${MASTER_ADDR:-} ]]; then
        die "NNODES=$NNODES needs MASTER_ADDR, the address of node 0 (and the same PORT" \
            "on every node)"
    fi
    rendezvous=(--nnodes="$NNODES" --node_rank="$NODE_RANK"
        --master_addr="${MASTER_ADDR:-127.0.0.1}" --master_port="${PORT:-29500}")
fi

# exec: torchrun takes this shell's place, so Ctrl-C, SIGTERM or a scheduler's kill reach
# torchrun itself, which stops exactly the workers it started (SIGTERM, then SIGKILL after a
# grace period) and exits non-zero. Nothing is killed by name: killing every "python" of the
# node once ended other users' jobs.
exec "$PYTHON" -m torch.distributed.run "${rendezvous[@]}" --nproc_per_node="$cards" \
    "$TRAIN_SCRIPT" "$CONFIG" "$@" --launcher pytorch

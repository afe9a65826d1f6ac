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
die() {
    echo "$NAME: error: $*" >&2
    exit 1
}

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

TEST_SCRIPT=${TEST_SCRIPT:-$REPO/tools/test.py}
[[ -f $TEST_SCRIPT ]] || die "test script not found: $TEST_SCRIPT (set TEST_SCRIPT)"

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
    "$TEST_SCRIPT" "$CONFIG" "$CHECKPOINT" "$@" --launcher pytorch

# shellcheck shell=bash
# Shared by tools/dist_train.sh and tools/dist_test.sh (sourced, not run): interpreter and
# paths, the node's card count, the rendezvous flags, and the exec of torchrun.
# The caller sets NAME and `cards` (empty: count them) before calling these.

die() {
    echo "$NAME: error: $*" >&2
    exit 1
}

PYTHON=${PYTHON:-python}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# The checkout first, so custom_imports=['mmgcu'] works without installing mmgcu.
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"

# Sets `cards` to every card of the node when it is empty, then checks it.
resolve_cards() {
    if [[ -z $cards ]]; then
        # Counted without initialising a card, so no card is held by this shell's python.
        # Run as a plain script: it imports neither mmgcu nor torch, so it takes milliseconds.
        local counter="$REPO/mmgcu/device/cards.py"
        cards=$("$PYTHON" "$counter") ||
            die "could not count the cards with '$PYTHON $counter'; give CARDS"
        [[ $cards =~ ^[0-9]+$ ]] || die "'$PYTHON $counter' printed '$cards'"
        if ((cards == 0)); then
            die "found no GCU card on this node ($("$PYTHON" "$counter" --why)). Check the" \
                "driver with 'efsmi' and the visible-devices variables, or give the number" \
                "of cards: $NAME CONFIG CARDS ..."
        fi
    fi
    cards=$((10#$cards)) # base 10: "08" is not octal
    ((cards > 0)) || die "CARDS must be at least 1, got $cards"
}

# Sets the `rendezvous` array from NNODES, NODE_RANK, MASTER_ADDR and PORT.
resolve_rendezvous() {
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
        # Every node must name the same address and port, so nothing is picked at random.
        if ((NNODES > 1)) && [[ -z ${MASTER_ADDR:-} ]]; then
            die "NNODES=$NNODES needs MASTER_ADDR, the address of node 0 (and the same PORT" \
                "on every node)"
        fi
        rendezvous=(--nnodes="$NNODES" --node_rank="$NODE_RANK"
            --master_addr="${MASTER_ADDR:-127.0.0.1}" --master_port="${PORT:-29500}")
    fi
}

# exec: torchrun takes this shell's place, so Ctrl-C, SIGTERM or a scheduler's kill reach
# torchrun itself, which stops exactly the workers it started (SIGTERM, then SIGKILL after a
# grace period) and exits non-zero. Nothing is killed by name: killing every "python" of the
# node once ended other users' jobs.
exec_torchrun() {
    resolve_cards
    resolve_rendezvous
    exec "$PYTHON" -m torch.distributed.run "${rendezvous[@]}" --nproc_per_node="$cards" \
        "$@" --launcher pytorch
}

#!/usr/bin/env bash
# Train with mmseg's stock tools/train.py on GCU cards of a slurm cluster: one task per card,
# started by srun, each running train.py with --launcher slurm.
#
#   tools/slurm_train.sh PARTITION JOB_NAME CONFIG [WORK_DIR] [train.py args...]
#
# Environment (as OpenMMLab's slurm_train.sh, GPUS* named CARDS* here):
#   CARDS           cards (= tasks) in all (default 8)
#   CARDS_PER_NODE  cards (= tasks) per node (default 8, one T20 server)
#   CPUS_PER_TASK   CPU cores per task (default 5)
#   SRUN_ARGS       extra srun arguments, split on spaces
#   GRES            a --gres request, e.g. gcu:8 where the cluster defines a GCU GRES
#                   (cards are no standard slurm resource, so none is requested by default)
#   PORT            the rendezvous port (default: mmgcu's 29500)
#   PYTHON, TRAIN_SCRIPT  as in tools/dist_train.sh
set -euo pipefail

NAME=$(basename "$0")
usage() {
    echo "usage: $NAME PARTITION JOB_NAME CONFIG [WORK_DIR] [train.py args...]" >&2
    echo "       (env: CARDS, CARDS_PER_NODE, CPUS_PER_TASK, SRUN_ARGS, GRES, PORT," \
        "PYTHON, TRAIN_SCRIPT)" >&2
    exit 2
}
# shellcheck source=tools/launch_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/launch_common.sh"

[[ $# -ge 3 && $1 != -* && $2 != -* && $3 != -* ]] || usage
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
shift 3
[[ -f $CONFIG ]] || die "config not found: $CONFIG"
# WORK_DIR is optional, so an argument that starts with '-' is already one for train.py.
work_dir=()
if [[ $# -ge 1 && $1 != -* ]]; then
    work_dir=(--work-dir="$1")
    shift
fi

CARDS=${CARDS:-8}
CARDS_PER_NODE=${CARDS_PER_NODE:-8}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
for var in CARDS CARDS_PER_NODE CPUS_PER_TASK; do
    [[ ${!var} =~ ^[1-9][0-9]*$ ]] || die "$var must be a positive integer, got '${!var}'"
done
# Fewer cards than a node holds: all tasks go on one node.
tasks_per_node=$((CARDS < CARDS_PER_NODE ? CARDS : CARDS_PER_NODE))
read -r -a srun_args <<<"${SRUN_ARGS:-}"
if [[ -n ${GRES:-} ]]; then
    srun_args=(--gres="$GRES" ${srun_args[@]+"${srun_args[@]}"})
fi

# The checkout first, so custom_imports=['mmgcu'] works without installing mmgcu; srun
# passes this environment on to every task.
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
if [[ -n ${PORT:-} ]]; then
    export MASTER_PORT=$PORT
fi

# Resolved here, on the submitting node (slurm nodes share this environment's path), by
# mmgcu train's own lookup: TRAIN_SCRIPT, else mmseg's tools/train.py; it says what is
# missing when this python has no mmseg.
TRAIN_SCRIPT=$("$PYTHON" "$REPO/mmgcu/cli/launch.py" --prog "$NAME" --train-script) || exit 1

# exec: srun takes this shell's place, so signals reach srun, which cancels only this job's
# tasks (--kill-on-bad-exit: one failed task ends the others). Nothing is killed by name.
exec srun -p "$PARTITION" \
    --job-name="$JOB_NAME" \
    --ntasks="$CARDS" \
    --ntasks-per-node="$tasks_per_node" \
    --cpus-per-task="$CPUS_PER_TASK" \
    --kill-on-bad-exit=1 \
    ${srun_args[@]+"${srun_args[@]}"} \
    "$PYTHON" -u "$TRAIN_SCRIPT" "$CONFIG" ${work_dir[@]+"${work_dir[@]}"} "$@" --launcher slurm

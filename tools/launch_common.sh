# shellcheck shell=bash
# Shared by tools/dist_train.sh and tools/dist_test.sh (sourced, not run): they are thin
# wrappers of `mmgcu train` / `mmgcu test` (mmgcu/cli/launch.py), run as a plain script so
# that this checkout works without installing mmgcu and nothing heavy is imported before
# torchrun starts. The caller sets NAME before sourcing this.

die() {
    echo "$NAME: error: $*" >&2
    exit 1
}

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# `python` as in OpenMMLab's scripts; python3 where the system has no `python`.
PYTHON=${PYTHON:-$(command -v python || command -v python3 || echo python)}
command -v "$PYTHON" >/dev/null 2>&1 ||
    die "PYTHON=$PYTHON is not a command. Activate the environment mmgcu is installed in" \
        "('source .venv/bin/activate' after 'make install'; on a T20 the vendor's" \
        "environment), or set PYTHON=/path/to/env/bin/python"

# exec: the launcher, then torchrun, take this shell's place, so Ctrl-C, SIGTERM or a
# scheduler's kill reach torchrun itself, which stops exactly the workers it started
# (SIGTERM, then SIGKILL after a grace period) and exits non-zero. Nothing is killed by
# name: killing every "python" of the node once ended other users' jobs.
exec_launch() {
    exec "$PYTHON" "$REPO/mmgcu/cli/launch.py" --prog "$NAME" "$@"
}

#!/usr/bin/env bash
# Install mmgcu into a T20's vendor environment (Python 3.8, torch 1.10 from torch_gcu 1.x)
# without replacing its torch. Usage:
#
#     tools/install_t20.sh /path/to/vendor/env/bin/python
#
# It creates no environment: it installs into the one whose python it is given, which must
# already import torch. Every pip call is constrained to the torch (and numpy) found there,
# so nothing below can upgrade or reinstall them; a requirement that would need another
# torch fails instead of silently replacing the vendor's build.
set -euo pipefail

PY=${1:?"usage: tools/install_t20.sh PYTHON (the python of the vendor environment)"}
cd "$(dirname "$0")/.."

if ! "$PY" -c "import torch" 2>/dev/null; then
    echo "install_t20: $PY cannot import torch; install the vendor's torch/torch_gcu first" >&2
    exit 1
fi

constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
"$PY" - >"$constraints" <<'EOF'
import numpy
import torch

print(f"torch=={torch.__version__}")
print(f"numpy=={numpy.__version__}")
EOF
echo "install_t20: pip is constrained to" $(cat "$constraints")

pip_install() { "$PY" -m pip install --quiet -c "$constraints" "$@"; }

# What the mmcv source build needs (setuptools<70: its setup.py imports pkg_resources).
pip_install -r requirements/build.txt
# mmcv with compiled ops, built against this torch (6-11 min on 2 cores; pip caches the wheel).
"$PY" -c "import mmcv._ext" 2>/dev/null ||
    MMCV_WITH_OPS=1 FORCE_CUDA=0 pip_install --no-build-isolation mmcv==2.1.0
pip_install -r requirements/runtime.txt -r requirements/optional.txt -r requirements/tests.txt
# mmgcu itself, editable, with no dependency resolution of its own.
"$PY" -m pip install --quiet --no-build-isolation --no-deps -e .
"$PY" -c 'import sys, torch; print("install_t20: mmgcu installed for Python", sys.version.split()[0], "torch", torch.__version__)'

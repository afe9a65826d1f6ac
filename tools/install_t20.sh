#!/usr/bin/env bash
# Install mmgcu into a T20's vendor environment (Python 3.8, torch 1.10 from torch_gcu 1.x)
# without replacing its torch. Usage:
#
#     tools/install_t20.sh /path/to/vendor/env/bin/python
#
# It creates no environment: it installs into the one whose python it is given, which must
# already import torch. Every pip call is constrained to the torch (and numpy) found there,
# so nothing below can upgrade or reinstall them; a requirement that would need another
# torch fails instead of silently replacing the vendor's build. Besides mmcv, mmengine and
# mmseg it installs mmpretrain, and torchvision for mmpretrain only where there is none; with
# --mmdet also mmdet (requirements/zoo.txt), which Mask2Former and MaskFormer configs need.
set -euo pipefail

PY=${1:?"usage: tools/install_t20.sh PYTHON [--mmdet] (the python of the vendor environment)"}
WITH_MMDET=${2:-}
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
pip_install -r requirements/runtime.txt -r requirements/optional.txt
# torchvision, which mmpretrain imports. The vendor's, if it has one, stays. Else the
# PyPI build made for this very torch, with --no-deps: its wheel requires torch==<that
# release>, and pip would replace the vendor's torch to satisfy it.
if "$PY" -c "import torchvision" 2>/dev/null; then
    echo "install_t20: keeping the torchvision already installed:" \
        "$("$PY" -c 'import torchvision; print(torchvision.__version__)')"
else
    torch_version=$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])')
    # pytorch/vision's table: the torchvision release built against each torch release.
    case "$torch_version" in
        1.10.0) torchvision=0.11.1 ;;
        1.10.1) torchvision=0.11.2 ;;
        1.10.2) torchvision=0.11.3 ;;
        *)
            echo "install_t20: no torchvision known for torch $torch_version; install the" \
                "vendor's torchvision for it, then run this again" >&2
            exit 1
            ;;
    esac
    echo "install_t20: installing torchvision $torchvision (built for torch $torch_version), --no-deps"
    pip_install --no-deps "torchvision==$torchvision"
    "$PY" -c "import torchvision" ||
        { echo "install_t20: torchvision $torchvision does not import with this torch" >&2; exit 1; }
fi
# mmpretrain (DINOv2 and other backbones).
pip_install -r requirements/t20-models.txt
if [ "$WITH_MMDET" = "--mmdet" ]; then
    pip_install -r requirements/zoo.txt
fi
# mmgcu itself, editable, with no dependency resolution of its own.
"$PY" -m pip install --quiet --no-build-isolation --no-deps -e .
# The check below imports yapf (mmengine's Config does) first, in one process: yapf writes
# its grammar cache on the first import after an install and renames the file into place
# before flushing it, so eight ranks starting together could read it empty ("EOFError: Ran
# out of input" in load_grammar).
"$PY" - <<'EOF'
import sys

import yapf  # writes its cache first (see above)
import mmpretrain
import torch
import torchvision

try:
    import mmdet

    mmdet_version = mmdet.__version__
except ImportError:
    mmdet_version = "not installed (tools/install_t20.sh PYTHON --mmdet)"
print(
    f"install_t20: mmgcu installed for Python {sys.version.split()[0]}, torch {torch.__version__},"
    f" torchvision {torchvision.__version__}, mmpretrain {mmpretrain.__version__},"
    f" mmdet {mmdet_version}"
)
EOF

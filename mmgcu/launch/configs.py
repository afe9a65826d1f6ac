"""Where the configs shipped with mmgcu are, for ``_base_``, ``mmgcu train`` and ``mmgcu configs``.

The wheel carries ``configs/`` as package data under ``mmgcu/.mim/configs`` (OpenMMLab's
place for a package's configs; in a checkout it is a link to ``configs/``). mmengine 0.10.7
resolves a ``scope::path`` base only for its own fixed list of packages, so
``mmgcu::_base_/gcu_runtime.py`` cannot work, and its pure-Python ``read_base()`` style can
inherit only pure-Python configs, which mmseg 1.2.2 does not have. A config therefore
names mmgcu's base by its path, which ``mmgcu configs`` prints.
"""

import os
import os.path as osp
from typing import List, Optional

BASE = "_base_/gcu_runtime.py"


def config_root() -> str:
    """The folder of the configs shipped with this mmgcu (real path, links resolved)."""
    package = osp.dirname(osp.dirname(osp.abspath(__file__)))
    return osp.realpath(osp.join(package, ".mim", "configs"))


def shipped_configs(root: Optional[str] = None) -> List[str]:
    """The configs one can train (``_base_`` files excluded), relative to the root."""
    root = root or config_root()
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "_base_")
        found += [osp.relpath(osp.join(folder, f), root) for f in files if f.endswith(".py")]
    return sorted(p.replace(os.sep, "/") for p in found)


def find_config(name: str, root: Optional[str] = None) -> Optional[str]:
    """The path of a shipped config named by its path under the root, its file name or its
    stem (``tiny/fcn_r18-tiny_8xgcu_synthetic-64x64.py``, ``fcn_r18-tiny_8xgcu_synthetic-64x64``),
    or None when no single one matches."""
    root = root or config_root()
    exact = osp.join(root, name)
    if osp.isfile(exact):
        return exact
    stem = osp.splitext(osp.basename(name))[0]
    matches = [p for p in shipped_configs(root) if osp.splitext(osp.basename(p))[0] == stem]
    return osp.join(root, matches[0]) if len(matches) == 1 else None

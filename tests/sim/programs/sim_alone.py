"""Import first (``import sim_alone``) to load ``mmgcu.sim`` without ``mmgcu/__init__.py``.

That file imports mmengine and, with ``MMGCU_SIMULATE`` set, installs the simulator by
itself; the programs here prove the simulator alone, whatever else is installed.
"""

import os
import sys
import types

_package = types.ModuleType("mmgcu")
_package.__path__ = [os.path.join(os.path.dirname(__file__), "..", "..", "..", "mmgcu")]
sys.modules["mmgcu"] = _package

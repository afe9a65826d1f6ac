"""What a checkpoint pickles: plain values in mmgcu's, an allow-list for mmengine's.

Checkpoints ``GCURunner`` writes hold only plain Python values and CPU tensors
(:func:`plain`): the message hub's ``HistoryBuffer`` objects become dicts of tensors, numpy
arrays lists and numpy scalars Python numbers. Any ``torch.load`` reads them, whatever its
numpy: a numpy 2 pickle names ``numpy._core``, which numpy 1.x (the T20 stack's) does not
have, and torch >= 2.6 (``weights_only=True``, what stock mmengine and mmseg's tools/test.py
load with there) refuses every object that is not plain. ``GCURunner`` restores the hub's
``HistoryBuffer`` objects when it loads one (:func:`restore_message_hub`).

Checkpoints in mmengine's own form (every mmengine 0.10.7 one) pickle those objects; they
load with the allow-list below.

torch >= 2.6 unpickles only allow-listed globals by default, and mmengine 0.10.7 calls
``torch.load`` without saying otherwise, so its own checkpoints stop loading
(``--resume``, ``load_from``). Asked about a checkpoint that ``GCURunner`` saved
(``torch.serialization.get_unsafe_globals_in_checkpoint``), torch names:

- ``mmengine.logging.history_buffer.HistoryBuffer``: the message hub's logged scalars;
- ``numpy.ndarray``, ``numpy.dtype`` and ``numpy._core.multiarray._reconstruct`` /
  ``.scalar`` (``numpy.core`` before numpy 2): the buffers' arrays, numpy scalars; loading
  also builds dtype objects, whose classes (``numpy.dtypes.Float64DType``, ...) must be
  allowed too: those of numpy's bool, integer and float types, which hold no code;
- ``builtins.getattr``: a HistoryBuffer pickles its table of statistics methods
  (``HistoryBuffer._statistics_methods``: ``min``, ``max``, ``current``, ``mean``), and
  pickle writes a function defined in a class as ``getattr(HistoryBuffer, 'min')``.
  ``getattr`` itself cannot be allow-listed: through it a pickle reaches any attribute of
  any allowed object and calls it (``object.__subclasses__`` and on), which is what the
  allow-list exists to stop. The name ``builtins.getattr`` is therefore bound to
  :func:`history_buffer_getattr`, which hands out HistoryBuffer's statistics methods and
  refuses everything else.

Exactly these are allowed, for the duration of the load only (torch's
``safe_globals`` context manager); nothing else changes. On torch < 2.6 (and on the T20's
torch 1.10, which has no such check) ``torch.load`` unpickles fully by default, as
mmengine expects, and this does nothing.
"""

import collections
import contextlib
import importlib
import pickle
import re

import numpy as np
import torch
from mmengine.logging import HistoryBuffer

from ..compat.mmengine import history_statistics
from ..errors import GCUError

#: HistoryBuffer's own statistics methods (its ``_set_default_statistics``).
STATISTICS = ("min", "max", "current", "mean")
#: The numpy types whose dtype objects a checkpoint may carry (logged values).
NUMBER_TYPES = ("bool_", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32")
NUMBER_TYPES += ("uint64", "float16", "float32", "float64")
_MULTIARRAY = ("numpy._core.multiarray", "numpy.core.multiarray")


#: The keys of a ``HistoryBuffer`` in a plain checkpoint.
HISTORY_KEYS = ("log_history", "count_history", "max_length")


def plain(obj):
    """``obj`` as plain Python values and CPU tensors, which every ``torch.load`` reads
    (``weights_only=True`` included): tensors moved to the CPU, a ``HistoryBuffer`` as a
    dict of :data:`HISTORY_KEYS`, numpy arrays as lists, numpy scalars as Python numbers,
    dict subclasses as dicts (an ``OrderedDict`` kept, with a state dict's ``_metadata``),
    named tuples as tuples. Other objects are left as they are."""
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if isinstance(obj, HistoryBuffer):
        logs, counts = obj.data
        return dict(
            log_history=torch.from_numpy(np.array(logs)),
            count_history=torch.from_numpy(np.array(counts)),
            max_length=int(obj.max_length),
        )
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        ordered = isinstance(obj, collections.OrderedDict)
        out = (collections.OrderedDict if ordered else dict)(
            (plain(k), plain(v)) for k, v in obj.items()
        )
        if ordered and getattr(obj, "_metadata", None) is not None:  # a state dict's versions
            out._metadata = plain(obj._metadata)
        return out
    if isinstance(obj, (list, tuple)):
        values = [plain(v) for v in obj]
        return values if isinstance(obj, list) else tuple(values)
    return obj


def restore_message_hub(checkpoint: dict) -> dict:
    """``checkpoint`` with its message hub's plain histories as ``HistoryBuffer`` objects
    again (in place; what an older checkpoint holds is left as it is)."""
    hub = checkpoint.get("message_hub")
    scalars = hub.get("log_scalars") if isinstance(hub, dict) else None
    for key, value in (scalars or {}).items():
        if isinstance(value, dict) and set(value) == set(HISTORY_KEYS):
            logs, counts = value["log_history"], value["count_history"]
            scalars[key] = HistoryBuffer(
                _as_list(logs), _as_list(counts), max_length=int(value["max_length"])
            )
    return checkpoint


def _as_list(values) -> list:
    return values.tolist() if isinstance(values, torch.Tensor) else list(values)


def history_buffer_getattr(obj, name):
    """``getattr`` for the one use an mmengine checkpoint makes of it: a statistics
    method of :class:`~mmengine.logging.HistoryBuffer` (the built-in four, or one
    registered with ``HistoryBuffer.register_statistics``)."""
    allowed = set(STATISTICS) | history_statistics()
    if obj is HistoryBuffer and isinstance(name, str) and name in allowed:
        return getattr(HistoryBuffer, name)
    raise pickle.UnpicklingError(
        f"getattr({obj!r}, {name!r}) in a checkpoint: only HistoryBuffer's statistics "
        "methods are allowed"
    )


def _multiarray():
    for name in _MULTIARRAY:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ImportError("numpy has neither numpy._core.multiarray nor numpy.core.multiarray")


def checkpoint_globals() -> list:
    """The allow-list, in the form ``torch.serialization.safe_globals`` takes."""
    multiarray = _multiarray()
    allowed = [HistoryBuffer, np.ndarray, np.dtype, (history_buffer_getattr, "builtins.getattr")]
    allowed += [type(np.dtype(getattr(np, name))) for name in NUMBER_TYPES]
    for module in _MULTIARRAY:  # the name numpy wrote, whichever numpy saved it
        allowed.append((multiarray._reconstruct, f"{module}._reconstruct"))
        allowed.append((multiarray.scalar, f"{module}.scalar"))
    return allowed


def restricted_by_default() -> bool:
    """Whether this torch's ``torch.load`` refuses globals that are not allow-listed."""
    major, minor = (int(x) for x in re.findall(r"\d+", torch.__version__)[:2])
    return (major, minor) >= (2, 6) and hasattr(torch.serialization, "safe_globals")


@contextlib.contextmanager
def mmengine_checkpoint_globals(filename=None):
    """Allow an mmengine checkpoint's globals while loading ``filename``; a checkpoint that
    pickles anything else is refused with its name and how to allow it."""
    if not restricted_by_default():
        yield
        return
    with torch.serialization.safe_globals(checkpoint_globals()):
        try:
            yield
        except pickle.UnpicklingError as e:
            raise GCUError(
                f"{filename or 'the checkpoint'} pickles an object that mmengine 0.10.7's "
                "own checkpoints do not, so torch.load refused it (mmgcu allows exactly "
                "those of mmgcu.checkpoint.plain). If you trust the file, allow its "
                "globals with torch.serialization.add_safe_globals([...]) in a module of the "
                f"config's custom_imports. torch said: {_why(e)}"
            ) from e


def _why(error: Exception) -> str:
    """The line of torch's long refusal that names the global."""
    lines = [x.strip() for x in str(error).splitlines() if x.strip()]
    named = [x for x in lines if "GLOBAL" in x or "getattr(" in x]
    return (named or lines or [""])[0][:300]

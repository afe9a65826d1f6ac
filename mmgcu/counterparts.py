"""Stock mmengine classes that assume CUDA, and the GCU classes that stand in for them.

Each GCU class declares what it replaces next to its own definition, one
:class:`Replacement` record per class: ``why`` says what the stock class gets wrong, ``does``
what the GCU class does instead (per capability of the accelerator where it differs, such
as a lazy card), which is what the one log line of a substitution says::

    @LOOPS.register_module()
    @replaces(ValLoop, why="its fp16 autocasts on the CPU", does="it autocasts on the card")
    class GCUValLoop(ValLoop): ...

:class:`Counterparts` resolves a config's ``type`` (a name, a scoped name such as
``'mmengine.ValLoop'``, or a class, as mmengine's pure-Python configs give it) through its
registry and returns the GCU class on GCU cards, logging each substitution once. Configs
and stock flags (``tools/train.py --amp`` sets ``AmpOptimWrapper``) therefore stay stock.
A user's subclass of a replaced stock class is kept, with a warning: it inherits the CUDA
assumption, and mmgcu cannot know what it overrides.

DDP is replaced on every kind of device (``everywhere=True``): the stock wrapper leaves the
model where ``get_device()`` says and gives DDP ``device_ids`` of its own. Several GCU
classes replace it; each says which accelerators it fits (``fits``: whether the
accelerator's own DDP class is torch's).
"""

import copy
import logging
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple, Union

from mmengine.logging import print_log


@dataclass(frozen=True)
class Replacement:
    """One GCU class and the stock classes it stands in for.

    Attributes:
        gcu: the GCU class.
        stock: the stock classes it replaces; a config that names the GCU class resolves
            as one that names the first (to the GCU class that fits the accelerator).
        why: what the stock classes get wrong.
        does: what the GCU class does instead: per capability of the accelerator (the name
            of a true attribute of it, such as ``'lazy'``; the first true one is said),
            with ``'*'`` for every other accelerator.
        everywhere: whether it stands in on every kind of device, not on GCU cards only.
    """

    gcu: type
    stock: Tuple[type, ...]
    why: str
    does: Dict[str, str]
    everywhere: bool = False

    def does_on(self, accelerator) -> str:
        """What the GCU class does on ``accelerator``."""
        for capability, text in self.does.items():
            if capability != "*" and getattr(accelerator, capability):
                return text
        return self.does["*"]


#: Every GCU class's record, in the order the classes were declared.
_RECORDS: Dict[type, Replacement] = {}


def replaces(*stock: type, why: str, does: Union[str, Dict[str, str]], everywhere: bool = False):
    """Class decorator: the decorated class stands in for each of ``stock`` on GCU cards
    (on every device with ``everywhere``). ``why`` says what the stock class gets wrong;
    ``does`` what this class does instead: one text, or one per capability of the
    accelerator (``'lazy'``, ``'caches_memory'``, ...) with ``'*'`` for the others."""

    def register(cls: type) -> type:
        texts = does if isinstance(does, dict) else {"*": does}
        if "*" not in texts:
            raise ValueError(f"@replaces of {cls.__name__}: does needs a '*' text")
        _RECORDS[cls] = Replacement(cls, tuple(stock), why, dict(texts), everywhere)
        return cls

    return register


def replacement_of(stock: type) -> List[type]:
    """The GCU classes registered for ``stock``."""
    return [record.gcu for record in _RECORDS.values() if stock in record.stock]


class Counterparts:
    """Resolves config types to the classes an accelerator needs, for one runner."""

    def __init__(self, accelerator):
        self.accelerator = accelerator
        self._said = set()

    def resolve(self, cfg, registry, default: Optional[str] = None):
        """``cfg`` (a dict) with its ``type`` as a class: the GCU class where one stands in."""
        if not isinstance(cfg, dict):
            if cfg is not None:
                self.check_instance(cfg)
            return cfg
        given = cfg.get("type", default)
        cls = given if isinstance(given, type) else registry.get(given) if given else None
        if cls is None:  # unknown names: mmengine's own error says it best
            return cfg
        cfg = copy.copy(cfg)
        cfg["type"] = self.target(cls)
        return cfg

    def target(self, cls: type) -> type:
        """The class to build for ``cls`` on this accelerator."""
        record = _RECORDS.get(cls)
        candidates = replacement_of(record.stock[0] if record else cls)
        if not candidates:
            self._check_subclass(cls)
            return cls
        chosen = self._choose(candidates)
        if chosen is None or chosen is cls:
            return cls
        self._say(cls, chosen)
        return chosen

    def _choose(self, candidates: List[type]) -> Optional[type]:
        if len(candidates) > 1:  # DDP: the wrapper that fits the accelerator's own DDP
            fitting = [c for c in candidates if c.fits(self.accelerator)]
            return fitting[0] if fitting else None
        (cls,) = candidates
        return cls if self.accelerator.is_gcu or _RECORDS[cls].everywhere else None

    def _gcu_for(self, stock: type) -> Optional[type]:
        """The GCU class that stands in for ``stock`` on this accelerator, if any."""
        candidates = replacement_of(stock)
        return self._choose(candidates) if candidates else None

    def check_instance(self, obj) -> None:
        """Warn about an already built object of a stock class that has a GCU counterpart."""
        cls = type(obj)
        gcu = self._gcu_for(cls)
        if gcu is not None:
            self._warn(
                cls,
                f"an already built {cls.__name__} was given, so mmgcu cannot build "
                f"{gcu.__name__} instead ({_RECORDS[gcu].why}). Give it as a config dict "
                f"(type='{cls.__name__}').",
            )

    def _check_subclass(self, cls: type) -> None:
        """Warn about a user's class that derives from a replaced stock class (the nearest
        one in its MRO) and not from any GCU class."""
        if not self.accelerator.is_gcu or issubclass(cls, tuple(_RECORDS)):
            return
        for stock in cls.__mro__[1:]:
            gcu = self._gcu_for(stock)
            if gcu is not None:
                why = _RECORDS[gcu].why
                self._warn(
                    cls,
                    f"{cls.__name__} subclasses {stock.__name__}, which assumes CUDA "
                    f"({gcu.__name__} exists because {why}). mmgcu keeps it as it is; "
                    f"derive it from {gcu.__name__} to run it on GCU cards.",
                )
                return

    def _say(self, cls: type, gcu: type) -> None:
        if (cls, gcu) not in self._said:
            self._said.add((cls, gcu))
            does = _RECORDS[gcu].does_on(self.accelerator)
            print_log(
                f"mmgcu: {gcu.__name__} stands in for {cls.__name__} on "
                f"{self.accelerator.kind}: {does}",
                logger="current",
            )

    def _warn(self, cls: type, message: str) -> None:
        if cls not in self._said:
            self._said.add(cls)
            print_log(f"mmgcu: {message}", logger="current", level=logging.WARNING)

"""Stock mmengine classes that assume CUDA, and the GCU classes that stand in for them.

Each GCU class declares what it replaces next to its own definition: ``why`` says what the
stock class gets wrong, ``does`` what the GCU class does instead (per device kind where it
differs), which is what the one log line of a substitution says::

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
from typing import Dict, List, Optional, Union

from mmengine.logging import print_log

_REPLACEMENTS: Dict[type, List[type]] = {}
_STOCK_OF: Dict[type, type] = {}
_WHY: Dict[type, str] = {}
_DOES: Dict[type, Dict[str, str]] = {}
_EVERYWHERE = set()


def replaces(*stock: type, why: str, does: Union[str, Dict[str, str]], everywhere: bool = False):
    """Class decorator: the decorated class stands in for each of ``stock`` on GCU cards
    (on every device with ``everywhere``). ``why`` says what the stock class gets wrong;
    ``does`` what this class does instead: one text, or one per device kind (``'gcu1'``,
    ``'gcu2'``, ...) with ``'*'`` for the others."""

    def register(cls: type) -> type:
        for base in stock:
            _REPLACEMENTS.setdefault(base, []).append(cls)
            _STOCK_OF.setdefault(cls, base)
        _WHY[cls] = why
        _DOES[cls] = does if isinstance(does, dict) else {"*": does}
        if everywhere:
            _EVERYWHERE.add(cls)
        return cls

    return register


def replacement_of(stock: type) -> List[type]:
    """The GCU classes registered for ``stock``."""
    return list(_REPLACEMENTS.get(stock, ()))


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
        stock = _STOCK_OF.get(cls, cls)
        candidates = _REPLACEMENTS.get(stock)
        if candidates is None:
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
        return cls if self.accelerator.is_gcu or cls in _EVERYWHERE else None

    def _gcu_for(self, stock: type) -> Optional[type]:
        """The GCU class that stands in for ``stock`` on this accelerator, if any."""
        return self._choose(_REPLACEMENTS[stock]) if stock in _REPLACEMENTS else None

    def check_instance(self, obj) -> None:
        """Warn about an already built object of a stock class that has a GCU counterpart."""
        cls = type(obj)
        gcu = self._gcu_for(cls)
        if gcu is not None:
            self._warn(
                cls,
                f"an already built {cls.__name__} was given, so mmgcu cannot build "
                f"{gcu.__name__} instead ({_WHY[gcu]}). Give it as a config dict "
                f"(type='{cls.__name__}').",
            )

    def _check_subclass(self, cls: type) -> None:
        """Warn about a user's class that derives from a replaced stock class (the nearest
        one in its MRO) and not from any GCU class."""
        if not self.accelerator.is_gcu or issubclass(cls, tuple(_STOCK_OF)):
            return
        for stock in cls.__mro__[1:]:
            gcu = self._gcu_for(stock)
            if gcu is not None:
                self._warn(
                    cls,
                    f"{cls.__name__} subclasses {stock.__name__}, which assumes CUDA "
                    f"({gcu.__name__} exists because {_WHY[gcu]}). mmgcu keeps it as it is; "
                    f"derive it from {gcu.__name__} to run it on GCU cards.",
                )
                return

    def _say(self, cls: type, gcu: type) -> None:
        if (cls, gcu) not in self._said:
            self._said.add((cls, gcu))
            kind = self.accelerator.kind
            does = _DOES[gcu].get(kind) or _DOES[gcu]["*"]
            print_log(
                f"mmgcu: {gcu.__name__} stands in for {cls.__name__} on {kind}: {does}",
                logger="current",
            )

    def _warn(self, cls: type, message: str) -> None:
        if cls not in self._said:
            self._said.add(cls)
            print_log(f"mmgcu: {message}", logger="current", level=logging.WARNING)

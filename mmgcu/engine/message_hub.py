"""``CardMessageHub``: the runner's message hub on GCU cards, reading the card once per
log line instead of once per logged scalar per step.

mmengine's ``MessageHub.update_scalar`` turns every logged value into a Python number as
it is logged (``.item()``), and ``RuntimeInfoHook`` logs every loss and accuracy of every
step. On a lazy torch_gcu 1.x card each such read runs the pending graph and waits for it
(on 2.x it synchronises the stream), defeating the asynchronous step. This hub, a
:class:`~mmengine.logging.MessageHub`, keeps scalars that are card tensors pending, in
order, and records them as mmengine's hub does in one transfer when anything reads the
scalars: ``LoggerHook`` at its interval, a checkpoint (``state_dict``), validation, a
hook's ``get_scalar``. Host values and the runtime info pass straight through, so what
the log, the vis backends and a checkpoint see is what stock mmengine records, in the same
order. It is also ``MessageHub.get_current_instance()``, so code that asks mmengine for
the current hub writes to it too. ``GCURuntimeInfoHook`` flushes at every loop boundary.

On a lazy card (torch_gcu 1.x) a step's scalars are IR until a graph outputs them, and a
graph run only to read them would compute the step's forward again. So at the end of each
iteration the hub stacks that iteration's scalars (:meth:`CardMessageHub.seal`, one card
tensor per dtype family) and ``GCURuntimeInfoHook`` hands the stacks to the step's graph as
outputs; reading them later is a transfer.
"""

from typing import List, Optional, Set, Tuple

import torch
from mmengine.logging import MessageHub

from ..compat.mmengine import make_current_message_hub, scalar_history

_Pending = Tuple[str, torch.Tensor, int, bool]


def _on_card(value) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type != "cpu" and value.numel() == 1


def _widest(dtypes, floating: bool) -> torch.dtype:
    """A dtype that holds every value of ``dtypes`` exactly (as ``.item()`` returns it)."""
    if floating:
        return torch.float64 if torch.float64 in dtypes else torch.float32
    return torch.int64 if torch.int64 in dtypes else torch.int32


class CardMessageHub(MessageHub):
    """A :class:`MessageHub` whose card scalars wait; see the module's docstring.

    Args: those of :class:`MessageHub`.
    """

    def __init__(self, name: str, log_scalars=None, runtime_info=None, resumed_keys=None):
        super().__init__(name, log_scalars, runtime_info, resumed_keys)
        self._pending: List[_Pending] = []
        # The pending values stacked so far (their indices in _pending, the card stack),
        # and how many of _pending they cover.
        self._stacks: List[Tuple[List[int], torch.Tensor]] = []
        self._sealed = 0
        # Kept with the pending values, so that no per-step check walks them.
        self._pending_keys: Set[str] = set()
        self._new_keys: Set[str] = set()  # pending keys the hub has never seen

    @classmethod
    def build(cls, message_hub: Optional[dict], default_name: str) -> "CardMessageHub":
        """The runner's hub from its config (as ``Runner.build_message_hub`` reads it), made
        the current instance of :class:`MessageHub` too, so that what asks mmengine for the
        current hub (``MessageHub.get_current_instance()``) gets this one."""
        if message_hub is not None and not isinstance(message_hub, dict):
            raise TypeError(f"message_hub should be dict or None, but got {message_hub}")
        cfg = dict(message_hub or {})
        cfg.setdefault("name", default_name)
        hub = cls.get_instance(**cfg)
        make_current_message_hub(hub)
        return hub

    # -- writes: card scalars wait ----------------------------------------------------
    def update_scalar(self, key: str, value, count: int = 1, resumed: bool = True) -> None:
        if _on_card(value) and isinstance(count, int):
            self._pending.append((key, value.detach(), count, resumed))
            if key not in self._pending_keys:
                self._pending_keys.add(key)
                if key not in super().log_scalars:
                    self._new_keys.add(key)
            return
        # A host value (IterTimerHook's times, every step) passes straight through; only a
        # pending key the hub has never seen goes first, so that the log's key order (the
        # order keys first arrive) is stock mmengine's.
        if self._new_keys:
            self.flush()
        super().update_scalar(key, value, count, resumed)

    # -- reads: everything pending arrives first --------------------------------------
    @property
    def log_scalars(self):
        self.flush()
        return super().log_scalars

    def get_scalar(self, key: str):
        """The key's history; pending values arrive first only if they are of that key
        (IterTimerHook reads its own time every step)."""
        if key in self._pending_keys:
            self.flush()
        return scalar_history(self, key)

    def state_dict(self) -> dict:
        self.flush()
        return super().state_dict()

    def load_state_dict(self, state_dict) -> None:
        self.flush()
        super().load_state_dict(state_dict)

    def has_new_keys(self) -> bool:
        """Whether a pending scalar is one the hub has never seen (its place in the log's
        order is decided when it first arrives)."""
        return bool(self._new_keys)

    def seal(self) -> List[torch.Tensor]:
        """Stack the scalars that arrived since the last seal, one card tensor per dtype
        family, and return the stacks (for the step's graph to output them)."""
        stacks = self._stack(range(self._sealed, len(self._pending)))
        self._stacks.extend(stacks)
        self._sealed = len(self._pending)
        return [stacked for _, stacked in stacks]

    def _stack(self, indices) -> List[Tuple[List[int], torch.Tensor]]:
        """The values at ``indices`` of the pending list, stacked per dtype family."""
        stacks = []
        for floating in (True, False):
            family = [i for i in indices if self._pending[i][1].is_floating_point() == floating]
            if family:
                dtype = _widest([self._pending[i][1].dtype for i in family], floating)
                values = [self._pending[i][1].reshape(()).to(dtype) for i in family]
                stacks.append((family, torch.stack(values)))
        return stacks

    def flush(self) -> None:
        """Hand every pending scalar to the hub: one host read per stack (a stack per dtype
        family of each sealed iteration and of what arrived since)."""
        if not self._pending:
            return
        stacks = self._stacks + self._stack(range(self._sealed, len(self._pending)))
        pending, self._pending, self._stacks, self._sealed = self._pending, [], [], 0
        self._pending_keys.clear()
        self._new_keys.clear()
        values = [None] * len(pending)
        for indices, stacked in stacks:
            for i, value in zip(indices, stacked.cpu().tolist()):
                values[i] = value
        for (key, _, count, resumed), value in zip(pending, values):
            super().update_scalar(key, value, count, resumed)

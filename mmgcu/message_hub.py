"""``CardMessageHub``: the runner's message hub on GCU cards, reading the card once per
log line instead of once per logged scalar per step.

mmengine's ``MessageHub.update_scalar`` turns every logged value into a Python number as
it is logged (``.item()``), and ``RuntimeInfoHook`` logs every loss and accuracy of every
step. On a lazy torch_gcu 1.x card each such read runs the pending graph and waits for it
(on 2.x it synchronises the stream), defeating the asynchronous step. This hub keeps
scalars that are card tensors pending, in order, and hands them to the real
:class:`~mmengine.logging.MessageHub` in one transfer when anything reads the scalars:
``LoggerHook`` at its interval, a checkpoint (``state_dict``), validation, a hook's
``get_scalar``. Host values and the runtime info pass straight through, so what the log,
the vis backends and a checkpoint see is what stock mmengine records, in the same order.

Objects that hold the real hub (``MessageHub.get_current_instance()``) see a pending
value only after the next flush; ``GCURuntimeInfoHook`` flushes at every loop boundary.
"""

from typing import Any, List, Set, Tuple

import torch
from mmengine.logging import MessageHub

_Pending = Tuple[str, torch.Tensor, int, bool]


def _on_card(value) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type != "cpu" and value.numel() == 1


def _widest(dtypes, floating: bool) -> torch.dtype:
    """A dtype that holds every value of ``dtypes`` exactly (as ``.item()`` returns it)."""
    if floating:
        return torch.float64 if torch.float64 in dtypes else torch.float32
    return torch.int64 if torch.int64 in dtypes else torch.int32


class CardMessageHub:
    """Wraps a :class:`MessageHub`; see the module's docstring.

    Args:
        hub: the runner's real message hub.
    """

    def __init__(self, hub: MessageHub):
        self.hub = hub
        self._pending: List[_Pending] = []
        # Kept with the pending values, so that no per-step check walks them.
        self._pending_keys: Set[str] = set()
        self._new_keys: Set[str] = set()  # pending keys the hub has never seen

    # -- writes: card scalars wait ----------------------------------------------------
    def update_scalar(self, key: str, value, count: int = 1, resumed: bool = True) -> None:
        if _on_card(value) and isinstance(count, int):
            self._pending.append((key, value.detach(), count, resumed))
            if key not in self._pending_keys:
                self._pending_keys.add(key)
                if key not in self.hub.log_scalars:
                    self._new_keys.add(key)
            return
        # A host value (IterTimerHook's times, every step) passes straight through; only a
        # pending key the hub has never seen goes first, so that the log's key order (the
        # order keys first arrive) is stock mmengine's.
        if self.has_new_keys():
            self.flush()
        self.hub.update_scalar(key, value, count, resumed)

    def update_scalars(self, log_dict: dict, resumed: bool = True) -> None:
        for key, value in log_dict.items():
            if isinstance(value, dict):
                self.update_scalar(key, value["value"], value.get("count", 1), resumed)
            else:
                self.update_scalar(key, value, 1, resumed)

    def update_info(self, key: str, value: Any, resumed: bool = True) -> None:
        self.hub.update_info(key, value, resumed)

    def update_info_dict(self, info_dict: dict, resumed: bool = True) -> None:
        self.hub.update_info_dict(info_dict, resumed)

    def get_info(self, key: str, default: Any = None) -> Any:
        return self.hub.get_info(key, default)

    def pop_info(self, key: str, default: Any = None) -> Any:
        return self.hub.pop_info(key, default)

    @property
    def runtime_info(self):
        return self.hub.runtime_info

    # -- reads: everything pending arrives first --------------------------------------
    @property
    def log_scalars(self):
        self.flush()
        return self.hub.log_scalars

    def get_scalar(self, key: str):
        """The key's history; pending values arrive first only if they are of that key
        (IterTimerHook reads its own time every step)."""
        if key in self._pending_keys:
            self.flush()
        return self.hub.get_scalar(key)

    def has_new_keys(self) -> bool:
        """Whether a pending scalar is one the hub has never seen (its place in the log's
        order is decided when it first arrives)."""
        return bool(self._new_keys)

    def flush(self) -> None:
        """Hand every pending scalar to the hub: one host read per dtype family."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        self._pending_keys.clear()
        self._new_keys.clear()
        values = [None] * len(pending)
        for floating in (True, False):
            indices = [i for i, p in enumerate(pending) if p[1].is_floating_point() == floating]
            if indices:
                dtype = _widest([pending[i][1].dtype for i in indices], floating)
                stacked = torch.stack([pending[i][1].reshape(()).to(dtype) for i in indices])
                for i, value in zip(indices, stacked.cpu().tolist()):
                    values[i] = value
        for (key, _, count, resumed), value in zip(pending, values):
            self.hub.update_scalar(key, value, count, resumed)

    def __getattr__(self, name: str):
        # Anything else (get_scalar, state_dict, load_state_dict, ...) may read scalars.
        if name in ("hub", "_pending", "_pending_keys", "_new_keys"):
            raise AttributeError(name)
        self.flush()
        return getattr(self.hub, name)

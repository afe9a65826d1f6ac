"""CPUCheckpointHook and to_cpu: every tensor a checkpoint holds is a CPU tensor.

A card tensor is stood for by :class:`CardTensor`, whose ``cpu()`` answers a plain tensor.
"""

import collections

import torch
from mmengine.registry import HOOKS

from mmgcu.hooks import CPUCheckpointHook
from mmgcu.hooks.checkpoint import to_cpu


class CardTensor(torch.Tensor):
    """A tensor on a card, as far as ``to_cpu`` can tell: ``cpu()`` copies it off."""

    def cpu(self, *args, **kwargs):
        return self.as_subclass(torch.Tensor).clone()


def on_card(*values):
    return torch.tensor(values, dtype=torch.float32).as_subclass(CardTensor)


def on_the_cpu(obj):
    """Whether no CardTensor is left anywhere in ``obj``."""
    if isinstance(obj, torch.Tensor):
        return type(obj) is torch.Tensor
    if isinstance(obj, dict):
        return all(on_the_cpu(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return all(on_the_cpu(v) for v in obj)
    return True


def test_to_cpu_moves_tensors_in_dicts_lists_and_tuples():
    nested = {"a": on_card(1.0), "b": [on_card(2.0), (on_card(3.0), "text")], "c": 4}

    moved = to_cpu(nested)

    assert on_the_cpu(moved)
    assert torch.equal(moved["b"][1][0], torch.tensor([3.0]))
    assert moved["c"] == 4 and moved["b"][1][1] == "text"
    assert type(moved["b"]) is list and type(moved["b"][1]) is tuple
    assert not on_the_cpu(nested)  # the original is left as it was


def test_to_cpu_keeps_the_container_types():
    ordered = collections.OrderedDict([("z", on_card(1.0)), ("a", on_card(2.0))])
    moved = to_cpu(ordered)
    assert type(moved) is collections.OrderedDict and list(moved) == ["z", "a"]
    assert on_the_cpu(moved)


def test_to_cpu_leaves_other_objects():
    marker = object()
    assert to_cpu(marker) is marker
    cpu_tensor = torch.ones(1)
    assert to_cpu(cpu_tensor) is cpu_tensor


Point = collections.namedtuple("Point", "x y")


def test_to_cpu_keeps_a_namedtuple_without_tensors():
    point = Point(1, 2)
    assert to_cpu(point) == point


def test_to_cpu_moves_tensors_in_a_namedtuple():
    moved = to_cpu({"stats": Point(on_card(1.0), 2)})
    assert type(moved["stats"]) is Point and on_the_cpu(moved)


def test_the_hook_moves_what_other_hooks_added():
    checkpoint = {
        "meta": {"epoch": 1},
        "state_dict": {"w": torch.ones(1)},
        "ema_state_dict": {"w": on_card(1.0)},  # an EMA hook's addition, left on the card
        "extra": [on_card(2.0)],
    }
    same = checkpoint

    CPUCheckpointHook().before_save_checkpoint(runner=None, checkpoint=checkpoint)

    assert checkpoint is same and on_the_cpu(checkpoint)
    assert checkpoint["meta"] == {"epoch": 1}
    assert torch.equal(checkpoint["ema_state_dict"]["w"], torch.tensor([1.0]))


def test_the_hook_runs_after_the_others():
    assert CPUCheckpointHook.priority == "LOWEST"
    assert HOOKS.get("CPUCheckpointHook") is CPUCheckpointHook

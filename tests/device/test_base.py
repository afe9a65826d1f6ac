"""What every accelerator inherits: the defaults of Accelerator, and CardGroup's collectives."""

from unittest import mock

import pytest
import torch

from mmgcu.device import Accelerator, CardGroup, GCUError


class FakeDist:
    """A ``torch.distributed``-like module whose collectives are recorded."""

    __name__ = "fake.distributed"
    ReduceOp = mock.Mock(SUM="sum-op")

    def __init__(self, world=4, backend="fake-backend"):
        self.world = world
        self.backend = backend
        self.calls = []

    def get_world_size(self, group=None):
        self.calls.append(("get_world_size", group))
        return self.world

    def get_backend(self, group=None):
        self.calls.append(("get_backend", group))
        return self.backend

    def all_reduce(self, tensor, op, group=None):
        self.calls.append(("all_reduce", op, group))
        tensor.mul_(self.world)

    def all_gather(self, parts, tensor, group=None):
        """Rank r's tensor is (r + 1) times this one's."""
        self.calls.append(("all_gather", len(parts), group))
        for rank, part in enumerate(parts):
            part.copy_(tensor * (rank + 1))

    def broadcast(self, tensor, src, group=None):
        self.calls.append(("broadcast", src, group))


@pytest.mark.parametrize(
    "method, args",
    [("is_available", ()), ("device_count", ()), ("current_device", ()), ("set_device", (0,))],
)
def test_card_queries_are_left_to_each_kind(method, args):
    with pytest.raises(NotImplementedError):
        getattr(Accelerator(), method)(*args)


def test_defaults_of_a_kind_without_extras():
    accelerator = Accelerator()
    assert accelerator.card_group is None
    assert accelerator.peak_memory(0) is None
    assert accelerator.empty_cache() is False
    assert accelerator.ddp_kwargs(3) == {}
    assert accelerator.check_collectives() is None
    assert accelerator.device_name() == accelerator.device_type


@pytest.mark.parametrize("call", ["autocast", "grad_scaler"])
def test_no_mixed_precision_unless_a_kind_offers_it(call):
    with pytest.raises(GCUError, match="not available on base"):
        getattr(Accelerator(), call)()


def test_default_step_is_the_optimizers_own():
    optimizer = mock.Mock()
    Accelerator().optimizer_step(optimizer, torch.nn.Linear(1, 1), torch.zeros(()), closure=2)
    optimizer.step.assert_called_once_with(closure=2)
    Accelerator().after_amp_step(optimizer, None, None, None)
    assert optimizer.step.call_count == 1  # nothing follows an AMP step by default


def test_default_groups_are_torch_distributeds(monkeypatch):
    made = []
    monkeypatch.setattr(
        torch.distributed, "init_process_group", lambda backend, **kw: made.append((backend, kw))
    )
    monkeypatch.setattr(torch.distributed, "get_backend", lambda group=None: "gloo")
    accelerator = Accelerator()

    group = accelerator.init_process_groups("gloo", timeout=5)

    assert made == [("gloo", dict(timeout=5))]
    assert group is accelerator.card_group
    expected = (torch.distributed, None, "torch.distributed gloo")
    assert (group.dist, group.group, group.name) == expected
    adopted = Accelerator().adopt_process_groups()
    assert (adopted.dist, adopted.group, adopted.name) == expected


def test_card_group_collectives_go_to_its_module_and_group():
    dist, group = FakeDist(world=4), object()
    card_group = CardGroup(dist, group, "fake eccl")

    tensor = torch.ones(2)
    card_group.all_reduce(tensor)
    card_group.broadcast(tensor, src=1)

    assert card_group.world_size == 4
    assert tensor.tolist() == [4.0, 4.0]  # summed in place
    assert dist.calls == [
        ("get_backend", group),  # not gloo: the module's own all-reduce
        ("all_reduce", "sum-op", group),  # the module's own ReduceOp, not torch's
        ("broadcast", 1, group),
        ("get_world_size", group),
    ]


def test_small_sums_over_gloo_are_gathered_and_added_in_place():
    dist, group = FakeDist(world=3, backend="gloo"), object()
    card_group = CardGroup(dist, group)

    small = torch.tensor([1.0, 2.0], requires_grad=True)[:]  # a view in an autograd graph
    card_group.all_reduce(small)
    assert small.tolist() == [6.0, 12.0]  # (1 + 2 + 3) times each value
    assert ("all_gather", 3, group) in dist.calls and ("get_backend", group) in dist.calls

    def collectives():
        return [c for c in dist.calls if c[0] in ("all_gather", "all_reduce")]

    for left_to_the_backend in (
        torch.ones(CardGroup.GLOO_GATHER_LIMIT // 3 + 1),  # 3 ranks' copies would be too many
        torch.ones(4, 2).t(),  # not contiguous
        torch.ones(2).to_sparse(),
    ):
        dist.calls.clear()
        card_group.all_reduce(left_to_the_backend)
        assert collectives() == [("all_reduce", "sum-op", group)]


def test_card_group_name_defaults_to_module_and_backend():
    assert CardGroup(FakeDist()).name == "fake.distributed fake-backend"
    assert CardGroup(FakeDist(), name="given").name == "given"

"""What every accelerator inherits: the defaults of Accelerator, and CardGroup's collectives."""

from unittest import mock

import pytest
import torch

from mmgcu.device import Accelerator, CardGroup, GCUError


class FakeDist:
    """A ``torch.distributed``-like module whose collectives are recorded."""

    __name__ = "fake.distributed"
    ReduceOp = mock.Mock(SUM="sum-op")

    def __init__(self, world=4, backend="fake-backend", rank=0):
        self.world = world
        self.backend = backend
        self.rank = rank
        self.calls = []

    def get_rank(self, group=None):
        return self.rank

    def get_world_size(self, group=None):
        self.calls.append(("get_world_size", group))
        return self.world

    def get_backend(self, group=None):
        self.calls.append(("get_backend", group))
        return self.backend

    def all_reduce(self, tensor, op, group=None):
        self.calls.append(("all_reduce", op, group))
        tensor.mul_(self.world)

    def gather(self, tensor, gather_list, dst, group=None):
        """Rank r's tensor is (r + 1) times this one's."""
        self.calls.append(("gather", None if gather_list is None else len(gather_list), dst))
        for rank, part in enumerate(gather_list or []):
            part.copy_(tensor * (rank + 1))

    def broadcast(self, tensor, src, group=None):
        """Rank ``src`` holds 10 times this rank's values unless it is this rank."""
        self.calls.append(("broadcast", src, group))
        if src != self.rank:
            tensor.mul_(10)


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
    assert accelerator.caches_memory is False
    assert (accelerator.lazy, accelerator.cudnn, accelerator.torch_sync_bn) == (False, False, False)
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
    dist, group = FakeDist(world=4, backend="gloo"), object()
    card_group = CardGroup(dist, group, "fake eccl")

    tensor = torch.ones(2)
    card_group.all_reduce(tensor)
    card_group.broadcast(tensor, src=1)

    assert card_group.world_size == 4
    assert tensor.tolist() == [40.0, 40.0]  # summed in place, then rank 1's (10 times)
    assert dist.calls == [
        ("all_reduce", "sum-op", group),  # a group of its own: the module's own all-reduce
        ("broadcast", 1, group),
        ("get_world_size", group),
    ]


def collectives(dist):
    return [c[0] for c in dist.calls if c[0] in ("gather", "broadcast", "all_reduce")]


def test_small_sums_over_gloo_go_through_rank_0_in_place():
    dist = FakeDist(world=3, backend="gloo")
    card_group = CardGroup(dist)

    small = torch.tensor([1.0, 2.0], requires_grad=True)[:]  # a view in an autograd graph
    card_group.all_reduce(small)
    assert small.tolist() == [6.0, 12.0]  # (1 + 2 + 3) times each value, rank 0's own
    assert ("gather", 3, 0) in dist.calls and ("broadcast", 0, None) in dist.calls
    assert collectives(dist) == ["gather", "broadcast"]

    dist.rank, dist.calls = 2, []  # another rank sends its part and takes rank 0's sum
    other = torch.tensor([1.0, 2.0])
    card_group.all_reduce(other)
    assert other.tolist() == [10.0, 20.0]
    assert ("gather", None, 0) in dist.calls

    for left_to_the_backend in (
        torch.ones(CardGroup.GLOO_GATHER_LIMIT // 3 + 1),  # 3 ranks' copies would be too many
        torch.ones(4, 2).t(),  # not contiguous
        torch.ones(2).to_sparse(),
    ):
        dist.calls.clear()
        card_group.all_reduce(left_to_the_backend)
        assert collectives(dist) == ["all_reduce"]


def test_other_backends_keep_their_own_all_reduce():
    dist = FakeDist(world=2, backend="nccl")
    card_group = CardGroup(dist)
    tensor = torch.ones(2)
    card_group.all_reduce(tensor)
    assert tensor.tolist() == [2.0, 2.0]
    assert collectives(dist) == ["all_reduce"] and ("get_backend", None) in dist.calls


def test_card_group_name_defaults_to_module_and_backend():
    assert CardGroup(FakeDist()).name == "fake.distributed fake-backend"
    assert CardGroup(FakeDist(), name="given").name == "given"

"""GCUDevicePlacementHook: misplaced tensors, two ranks on one card, the idle-cards warning.

``_verify`` is fed the per-rank records directly; ``_check`` runs on a faked backend whose
``device()`` is the CPU, with the all-gather replaced where several ranks are needed.
"""

import logging
from types import SimpleNamespace
from unittest import mock

import pytest
import torch

import mmgcu.hooks.placement as placement
from mmgcu.device import GCUError, physical_card
from mmgcu.hooks import GCUDevicePlacementHook
from tests.model.fakes import ConvBN, install_cpu, install_cuda, install_legacy, install_v2

verify = GCUDevicePlacementHook._verify


@pytest.fixture
def logged(monkeypatch):
    """The hook's print_log as a recorder."""
    recorder = mock.Mock()
    monkeypatch.setattr(placement, "print_log", recorder)
    return recorder


def record(rank, host="node0", card=0, physical=None, wrong=()):
    return dict(
        rank=rank,
        host=host,
        card=card,
        physical=str(card) if physical is None else physical,
        device=f"gcu:{card}",
        cards=8,
        misplaced=list(wrong[:5]),
        n_misplaced=len(wrong),
    )


def make_runner(model, rank=0):
    return SimpleNamespace(model=model, rank=rank, logger=mock.Mock())


def gather_as(monkeypatch, *others):
    """Pretend to be rank 0 of ``1 + len(others)``; the others' records are ``others``."""
    calls = []

    def all_gather_object(mine):
        calls.append(mine)
        return [mine, *others]

    monkeypatch.setattr(placement, "get_world_size", lambda: 1 + len(others))
    monkeypatch.setattr(placement, "all_gather_object", all_gather_object)
    return calls


def warnings_of(logged):
    return [c.args[0] for c in logged.call_args_list if c.kwargs.get("level") == logging.WARNING]


# -- _verify ---------------------------------------------------------------------------


def test_verify_names_rank_count_and_tensors():
    names = [f"layer{i}.weight on cpu" for i in range(7)]

    with pytest.raises(GCUError) as info:
        verify([record(0), record(3, card=3, wrong=names)])

    message = str(info.value)
    assert message.startswith("rank 3: 7 parameter(s)/buffer(s) are not on its card gcu:3: ")
    assert "layer0.weight on cpu, layer1.weight on cpu" in message
    assert "layer4.weight on cpu" in message and "layer5.weight" not in message


def test_verify_names_both_ranks_on_one_card():
    with pytest.raises(GCUError, match="ranks 1 and 6 both run on card 2 of node0"):
        verify([record(0), record(1, card=2), record(6, card=2)])


def test_verify_counts_more_ranks_than_cards_by_physical_card():
    ranks = [record(r, card=r % 4) for r in range(5)]  # 5 ranks, 4 cards

    with pytest.raises(GCUError, match="ranks 0 and 4 both run on card 0 of node0"):
        verify(ranks)


def test_verify_passes_one_card_per_rank():
    verify([record(r, card=r) for r in range(8)])


def test_verify_passes_the_same_card_on_different_hosts():
    verify([record(0, host="node0"), record(1, host="node1")])


def agent(monkeypatch, visible, first_rank, host="node0"):
    """The records of one launcher agent that sees the cards ``visible``."""
    monkeypatch.setenv("TOPS_VISIBLE_DEVICES", visible)
    count = len(visible.split(","))
    return [
        record(first_rank + i, host=host, card=i, physical=physical_card(i)) for i in range(count)
    ]


def test_verify_passes_agents_with_disjoint_visible_cards(monkeypatch):
    ranks = agent(monkeypatch, "0,1", 0) + agent(monkeypatch, "2,3", 2)

    verify(ranks)
    assert [r["card"] for r in ranks] == [0, 1, 0, 1]  # the local indices do repeat


def test_verify_refuses_agents_sharing_a_visible_card(monkeypatch):
    ranks = agent(monkeypatch, "1,2", 0) + agent(monkeypatch, "2,3", 2)

    with pytest.raises(GCUError, match="ranks 1 and 2 both run on card 2 of node0"):
        verify(ranks)


# -- _check on one rank --------------------------------------------------------------------


def test_misplaced_model_stops_the_run(monkeypatch):
    install_cpu(monkeypatch)
    model = torch.nn.Sequential(*[torch.nn.Linear(2, 2) for _ in range(4)]).to("meta")
    runner = make_runner(model, rank=0)

    with pytest.raises(GCUError) as info:
        GCUDevicePlacementHook().before_train(runner)

    message = str(info.value)
    assert message.startswith("rank 0: 8 parameter(s)/buffer(s) are not on its card cpu: ")
    assert "0.weight on meta, 0.bias on meta" in message
    assert "2.bias" not in message


def test_wrapped_model_is_checked_through_module(monkeypatch):
    install_cpu(monkeypatch)
    inner = ConvBN()
    inner.bn.running_var = inner.bn.running_var.to("meta")
    wrapper = mock.Mock(module=inner)
    monkeypatch.setattr(placement, "is_model_wrapper", lambda m: m is wrapper)

    with pytest.raises(GCUError, match="bn.running_var on meta"):
        GCUDevicePlacementHook().before_train(make_runner(wrapper))


def test_placed_model_is_logged(monkeypatch):
    install_v2(monkeypatch, current=1, on_cpu=True)
    monkeypatch.setenv("TOPS_VISIBLE_DEVICES", "4,5")
    runner = make_runner(ConvBN(), rank=0)

    GCUDevicePlacementHook().before_train(runner)

    fmt, generation, lines = runner.logger.info.call_args.args
    assert generation == "v2"
    assert "rank 0 on " in lines
    assert lines.endswith("cpu (card 1 of 8, physical card 5)")


@pytest.mark.parametrize("first", ["before_train", "before_val", "before_test"])
def test_each_loop_start_runs_the_check(monkeypatch, first):
    install_cpu(monkeypatch)
    runner = make_runner(ConvBN().to("meta"))

    with pytest.raises(GCUError):
        getattr(GCUDevicePlacementHook(), first)(runner)


def test_check_runs_once_for_all_loops(monkeypatch):
    install_cpu(monkeypatch)
    gathered = gather_as(monkeypatch, record(1, host="other", card=0))
    runner = make_runner(ConvBN())
    hook = GCUDevicePlacementHook()

    hook.before_train(runner)
    hook.before_val(runner)
    hook.before_test(runner)
    hook.before_val(runner)

    assert len(gathered) == 1
    assert runner.logger.info.call_count == 1


# -- _check across ranks --------------------------------------------------------------------


def test_another_rank_on_my_card_stops_the_run(monkeypatch):
    install_v2(monkeypatch, current=2, on_cpu=True)
    other = record(7, host=placement.socket.gethostname(), card=2)
    gathered = gather_as(monkeypatch, other)

    with pytest.raises(GCUError, match="ranks 0 and 7 both run on card 2 of "):
        GCUDevicePlacementHook().before_train(make_runner(ConvBN(), rank=0))

    assert gathered[0]["card"] == 2 and gathered[0]["physical"] == "2"


def test_another_ranks_misplaced_tensors_stop_every_rank(monkeypatch):
    install_cpu(monkeypatch)
    gather_as(monkeypatch, record(5, host="other", wrong=["head.weight on cpu"]))

    with pytest.raises(GCUError, match="rank 5: 1 parameter"):
        GCUDevicePlacementHook().before_train(make_runner(ConvBN(), rank=0))


# -- the idle-cards warning ------------------------------------------------------------------


@pytest.mark.parametrize("install", [install_v2, install_legacy], ids=["v2", "legacy"])
def test_single_process_on_many_gcus_is_warned(monkeypatch, logged, install):
    install(monkeypatch, cards=8, on_cpu=True)

    GCUDevicePlacementHook().before_train(make_runner(ConvBN()))

    (warning,) = warnings_of(logged)
    assert warning.startswith("using 1 of 8 GCUs: this is a single process, so 7 card(s) idle.")
    assert "--nproc_per_node=8" in warning


@pytest.mark.parametrize(
    "install, cards",
    [(install_v2, 1), (install_cpu, None), (install_cuda, 8)],
    ids=["one-gcu", "cpu", "cuda"],
)
def test_no_idle_warning_without_idle_gcus(monkeypatch, logged, install, cards):
    kwargs = {} if cards is None else dict(cards=cards)
    install(monkeypatch, on_cpu=True, **kwargs)

    GCUDevicePlacementHook().before_train(make_runner(ConvBN()))

    assert warnings_of(logged) == []


def test_no_idle_warning_with_several_ranks(monkeypatch, logged):
    install_v2(monkeypatch, cards=8, on_cpu=True)
    gather_as(monkeypatch, record(1, host="other"))

    GCUDevicePlacementHook().before_train(make_runner(ConvBN()))

    assert warnings_of(logged) == []

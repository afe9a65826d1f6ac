"""GCUDevicePlacementHook: misplaced tensors, two ranks on one card, the summary, idle cards.

``verify`` is fed the per-rank records directly; the hook runs on a stand-in runner with a
real accelerator whose ``device()`` is the CPU, with the all-gather replaced where several
ranks are needed.
"""

import copy
import logging
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from mmengine.optim import OptimWrapper

import mmgcu.engine.hooks.placement as placement
from mmgcu.binding import Binding
from mmgcu.device import GCUError, physical_card
from mmgcu.engine.hooks import GCUDevicePlacementHook
from mmgcu.engine.hooks.placement import summary, verify
from mmgcu.optim import GCUAmpOptimWrapper
from tests import fakes
from tests.conftest import run_log
from tests.fakes import ConvBN


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
        misplaced=list(wrong),
    )


def make_runner(accelerator, model=None, rank=0, optim_wrapper=None):
    """A stand-in runner; ``accelerator`` is what GCURunner would bind to the hook."""
    return SimpleNamespace(
        model=ConvBN() if model is None else model,
        rank=rank,
        logger=mock.Mock(),
        accelerator=accelerator,
        optim_wrapper=optim_wrapper,
    )


def check(runner):
    hook_of(runner).before_train(runner)


def hook_of(runner):
    """The hook as GCURunner builds it: bound to the runner's accelerator."""
    hook = GCUDevicePlacementHook()
    hook.bind(Binding(runner.accelerator))
    return hook


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


def logged_summary(runner):
    (line,) = runner.logger.info.call_args.args
    return line


# -- verify ------------------------------------------------------------------------------------


def test_verify_names_rank_count_and_tensors():
    wrong = [(f"layer{i}.weight", "cpu") for i in range(7)]

    with pytest.raises(GCUError) as info:
        verify([record(0), record(3, card=3, wrong=wrong)])

    message = str(info.value)
    assert message.startswith("rank 3: 7 parameter(s)/buffer(s) are not on its card gcu:3: ")
    assert "layer0.weight on cpu, layer1.weight on cpu" in message
    assert "layer4.weight on cpu ..." in message and "layer5.weight" not in message


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


# -- the hook on one rank ------------------------------------------------------------------------


def test_a_misplaced_model_stops_the_run():
    model = torch.nn.Sequential(*[torch.nn.Linear(2, 2) for _ in range(4)]).to("meta")

    with pytest.raises(GCUError) as info:
        check(make_runner(fakes.cpu(), model))

    message = str(info.value)
    assert message.startswith("rank 0: 8 parameter(s)/buffer(s) are not on its card cpu: ")
    assert "0.weight on meta, 0.bias on meta" in message
    assert "2.bias" not in message


def test_a_wrapped_model_is_checked_through_module(monkeypatch):
    inner = ConvBN()
    inner.bn.running_var = inner.bn.running_var.to("meta")
    wrapper = mock.Mock(module=inner)
    monkeypatch.setattr(placement, "is_model_wrapper", lambda m: m is wrapper)

    with pytest.raises(GCUError, match="bn.running_var on meta"):
        check(make_runner(fakes.cpu(), wrapper))


@pytest.mark.parametrize("first", ["before_train", "before_val", "before_test"])
def test_each_loop_start_runs_the_check(first):
    runner = make_runner(fakes.cpu(), ConvBN().to("meta"))

    with pytest.raises(GCUError):
        getattr(hook_of(runner), first)(runner)


def test_the_check_runs_once_for_all_loops(monkeypatch):
    gathered = gather_as(monkeypatch, record(1, host="other", card=0))
    runner = make_runner(fakes.cpu())
    hook = hook_of(runner)

    hook.before_train(runner)
    hook.before_val(runner)
    hook.before_test(runner)
    hook.before_val(runner)

    assert len(gathered) == 1
    assert runner.logger.info.call_count == 1


def test_its_priority_runs_it_before_other_hooks():
    assert GCUDevicePlacementHook.priority == "VERY_HIGH"


@pytest.mark.usefixtures("fresh_notes")
def test_under_a_plain_runner_it_does_nothing_and_says_so(runner_case):
    """Built by mmengine's own Runner (a stock tool with a config that lists it), it has no
    accelerator: no check, no summary, one line."""
    cfg = copy.deepcopy(runner_case.iter_based_cfg)
    cfg.train_cfg = dict(by_epoch=False, max_iters=2)
    cfg.custom_hooks = [dict(type="GCUDevicePlacementHook")]
    runner = runner_case.build_runner(cfg)

    runner.train()
    runner.test()

    (hook,) = [h for h in runner.hooks if isinstance(h, GCUDevicePlacementHook)]
    assert hook.accelerator is None
    log = run_log(runner)
    assert log.count("GCUDevicePlacementHook does nothing: it was not built by GCURunner") == 1
    assert "card tensors over" not in log  # no summary


# -- the summary ---------------------------------------------------------------------------------


def test_summary_of_a_gcu2_rank(monkeypatch):
    accelerator = fakes.gcu2(monkeypatch, current=1, on_cpu=True)
    monkeypatch.setenv("TOPS_VISIBLE_DEVICES", "4,5")
    model = ConvBN()
    optim_wrapper = GCUAmpOptimWrapper(
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1), dtype="bfloat16"
    )
    runner = make_runner(accelerator, model, optim_wrapper=optim_wrapper)

    check(runner)

    first, *ranks = logged_summary(runner).splitlines()
    assert first == (
        "mmgcu: gcu2 (torch_gcu 2.5.0 (2.x, PrivateUse1 'gcu')); card tensors over none (one "
        "process); no SyncBN layer; optimizer wrapper GCUAmpOptimWrapper (torch.bfloat16, "
        "overflow step 'skip'); "
        "memory column: peak allocated since the last log line (max_memory_allocated)"
    )
    (rank,) = ranks
    assert rank.startswith("    rank 0 on ")
    assert rank.endswith(": cpu (card 1 of 8, physical card 5)")


def test_summary_names_the_card_group_and_every_rank(monkeypatch):
    accelerator = fakes.gcu1(monkeypatch, on_cpu=True)
    accelerator.torch_gcu.distributed.group.WORLD = object()
    accelerator.adopt_process_groups()
    everyone = [record(0), record(1, host="node1", card=0, physical="3")]
    runner = make_runner(accelerator, optim_wrapper=dict(type="OptimWrapper"))

    text = summary(runner.accelerator, runner, everyone)

    first, *ranks = text.splitlines()
    assert "card tensors over torch_gcu.distributed eccl" in first
    assert "optimizer wrapper -;" in first  # not built yet (a test run)
    assert ranks == [
        "    rank 0 on node0: gcu:0 (card 0 of 8)",
        "    rank 1 on node1: gcu:0 (card 0 of 8, physical card 3)",
    ]


def test_summary_names_a_plain_optimizer_wrapper_without_a_dtype():
    model = ConvBN()
    runner = make_runner(
        fakes.cpu(), model, optim_wrapper=OptimWrapper(torch.optim.SGD(model.parameters(), lr=1))
    )
    assert "optimizer wrapper OptimWrapper; memory column: none" in summary(
        runner.accelerator, runner, [record(0)]
    )


# -- across ranks --------------------------------------------------------------------------------


def test_another_rank_on_my_card_stops_the_run(monkeypatch):
    accelerator = fakes.gcu2(monkeypatch, current=2, on_cpu=True)
    other = record(7, host=placement.socket.gethostname(), card=2)
    gathered = gather_as(monkeypatch, other)

    with pytest.raises(GCUError, match="ranks 0 and 7 both run on card 2 of "):
        check(make_runner(accelerator))

    assert gathered[0]["card"] == 2 and gathered[0]["physical"] == "2"


def test_another_ranks_misplaced_tensors_stop_every_rank(monkeypatch):
    gather_as(monkeypatch, record(5, host="other", wrong=[("head.weight", "cpu")]))

    with pytest.raises(GCUError, match="rank 5: 1 parameter"):
        check(make_runner(fakes.cpu()))


# -- the idle-cards warning ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["gcu2", "gcu1"])
def test_a_single_process_on_many_gcus_is_warned(monkeypatch, logged, kind):
    accelerator = fakes.ACCELERATORS[kind](monkeypatch, cards=8, on_cpu=True)

    check(make_runner(accelerator))

    (warning,) = warnings_of(logged)
    assert warning.startswith("using 1 of 8 GCUs: this is a single process, so 7 card(s) idle.")
    assert "--nproc_per_node=8" in warning


@pytest.mark.parametrize(
    "kind, cards", [("gcu2", 1), ("cpu", None), ("cuda", 8)], ids=["one-gcu", "cpu", "cuda"]
)
def test_no_idle_warning_without_idle_gcus(monkeypatch, logged, kind, cards):
    kwargs = {} if cards is None else dict(cards=cards)
    accelerator = fakes.ACCELERATORS[kind](monkeypatch, on_cpu=True, **kwargs)

    check(make_runner(accelerator))

    assert warnings_of(logged) == []


def test_no_idle_warning_with_several_ranks(monkeypatch, logged):
    gather_as(monkeypatch, record(1, host="other"))
    accelerator = fakes.gcu2(monkeypatch, cards=8, on_cpu=True)

    check(make_runner(accelerator))

    assert warnings_of(logged) == []

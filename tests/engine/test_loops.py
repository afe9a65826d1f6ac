"""GCUValLoop and GCUTestLoop: the stock ``run_iter`` inside the card's autocast.

The runner is a stand-in; the loop is bound to a real accelerator (GCU1Accelerator over the
fake torch_gcu 1.x, whose autocast records when it is entered and left) and a model whose
steps record what autocast state they ran in. Off a card (mmengine's own Runner, the CPU)
the loops are mmengine's.
"""

import contextlib
import copy
from types import SimpleNamespace
from unittest import mock

import mmengine.runner.loops as mm_loops
import pytest
import torch
from mmengine.evaluator import BaseMetric, Evaluator
from mmengine.runner import TestLoop, ValLoop

from mmgcu.binding import Binding
from mmgcu.engine.loops import GCUTestLoop, GCUValLoop
from tests import fakes


class Nothing(BaseMetric):
    def process(self, data_batch, data_samples):
        pass

    def compute_metrics(self, results):
        return {}


class Model(torch.nn.Module):
    """Records, at each step, the card autocast events seen so far."""

    def __init__(self, events):
        super().__init__()
        self.events = events
        self.seen = []

    def val_step(self, data):
        self.seen.append(list(self.events))
        return [torch.zeros(1)]

    test_step = val_step


@pytest.fixture
def events():
    return []


@pytest.fixture
def stock_autocast(monkeypatch):
    """mmengine's autocast in its loops, recorded: it would autocast on get_device()."""
    recorder = mock.Mock(side_effect=lambda **kwargs: contextlib.nullcontext())
    monkeypatch.setattr(mm_loops, "autocast", recorder)
    return recorder


def make_loop(loop_class, accelerator, events, fp16):
    runner = SimpleNamespace(model=Model(events), call_hook=mock.Mock(), visualizer=None)
    dataloader = torch.utils.data.DataLoader([0, 1], batch_size=1, collate_fn=list)
    loop = loop_class(runner, dataloader, Evaluator([Nothing()]), fp16=fp16)
    loop.bind(Binding(accelerator))  # as GCURunner does
    return loop


@pytest.mark.parametrize(
    "loop_class, stock, mode", [(GCUValLoop, ValLoop, "val"), (GCUTestLoop, TestLoop, "test")]
)
def test_fp16_autocasts_on_the_card_instead_of_get_device(
    monkeypatch, events, stock_autocast, loop_class, stock, mode
):
    loop = make_loop(loop_class, fakes.gcu1(monkeypatch, events=events), events, fp16=True)
    assert isinstance(loop, stock)
    assert loop.fp16 is False  # the stock autocast is turned off ...
    assert loop.card_fp16 is True  # ... and the card's applied instead

    loop.run_iter(0, [0])

    assert loop.runner.model.seen == [[("autocast", torch.float16, True)]]
    assert events[-1] == ("autocast exit",)
    stock_autocast.assert_called_once_with(enabled=False)
    hooks = [c.args[0] for c in loop.runner.call_hook.call_args_list]
    assert hooks == [f"before_{mode}_iter", f"after_{mode}_iter"]  # the stock run_iter ran


@pytest.mark.parametrize("loop_class", [GCUValLoop, GCUTestLoop])
def test_without_fp16_there_is_no_autocast(monkeypatch, events, stock_autocast, loop_class):
    accelerator = fakes.gcu1(monkeypatch, events=events)
    loop = make_loop(loop_class, accelerator, events, fp16=False)

    loop.run_iter(0, [0])

    assert loop.runner.model.seen == [[]]
    accelerator.torch_gcu.amp.autocast.assert_not_called()
    stock_autocast.assert_called_once_with(enabled=False)


def test_a_whole_run_autocasts_every_iteration(monkeypatch, events, stock_autocast):
    loop = make_loop(GCUValLoop, fakes.gcu1(monkeypatch, events=events), events, fp16=True)

    loop.run()

    cast = ("autocast", torch.float16, True)
    assert [seen[-1] for seen in loop.runner.model.seen] == [cast, cast]
    assert events == [cast, ("autocast exit",), cast, ("autocast exit",)]


@pytest.mark.usefixtures("fresh_notes")
@pytest.mark.parametrize("loop_class", [GCUValLoop, GCUTestLoop])
def test_on_the_cpu_fp16_is_the_stock_loops(events, stock_autocast, loop_class):
    loop = make_loop(loop_class, fakes.cpu(), events, fp16=True)
    assert loop.fp16 is True

    loop.run_iter(0, [0])

    stock_autocast.assert_called_once_with(enabled=True)  # mmengine's, on get_device()
    assert loop.runner.model.seen == [[]]


@pytest.mark.usefixtures("fresh_notes")
def test_under_a_plain_runner_they_are_the_stock_loops(runner_case, stock_autocast):
    cfg = copy.deepcopy(runner_case.iter_based_cfg)
    cfg.train_cfg = dict(by_epoch=False, max_iters=2, val_interval=2)
    cfg.val_cfg = dict(type="GCUValLoop", fp16=True)
    cfg.test_cfg = dict(type="GCUTestLoop", fp16=True)
    runner = runner_case.build_runner(cfg)

    runner.train()
    assert runner.test() == {"acc": 1}

    assert type(runner.val_loop) is GCUValLoop and type(runner.test_loop) is GCUTestLoop
    assert runner.val_loop.fp16 is True and runner.test_loop.fp16 is True
    # Every validation and test batch ran inside mmengine's autocast, with fp16 on.
    batches = len(runner.val_dataloader) + len(runner.test_dataloader)
    assert stock_autocast.call_args_list == [mock.call(enabled=True)] * batches

"""GCULogProcessor: mmengine's log line, with the card's memory at its end.

mmengine's own ``get_log_after_iter`` runs on a stand-in runner with a real MessageHub, the
processor bound to a real accelerator (GCU2 over a mocked torch.gcu, GCU1 over the fake
torch_gcu 1.x); under mmengine's own Runner (a stock tool) it is mmengine's processor.
"""

import copy
from types import SimpleNamespace

import pytest
import torch
from mmengine.logging import MessageHub
from mmengine.runner import LogProcessor, Runner

from mmgcu.binding import Binding
from mmgcu.engine.log_processor import GCULogProcessor
from tests import fakes
from tests.conftest import run_log

MiB = 1024 * 1024


@pytest.fixture(autouse=True)
def no_cuda(monkeypatch):
    """mmengine writes a memory column of its own where CUDA is available."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def runner(request):
    hub = MessageHub.get_instance(f"mmgcu-test-{request.node.name}")
    for key, value in dict(lr=0.01, loss=0.5, time=0.2, data_time=0.1).items():
        hub.update_scalar(f"train/{key}", value)
    hub.update_info("eta", 10)
    return SimpleNamespace(message_hub=hub, iter=2, max_iters=4, _train_loop=object())


def line(runner, accelerator):
    processor = GCULogProcessor(by_epoch=False)
    processor.bind(Binding(accelerator))  # as GCURunner does
    return processor.get_log_after_iter(runner, 2, "train")


def stock_line(runner):
    return LogProcessor(by_epoch=False).get_log_after_iter(runner, 2, "train")


def test_gcu2_logs_the_peak_since_the_last_line(monkeypatch, runner):
    accelerator = fakes.gcu2(monkeypatch, current=3)
    torch.gcu.max_memory_allocated.return_value = 7 * MiB + 5
    stock_tag, stock_str = stock_line(runner)

    tag, log_str = line(runner, accelerator)

    assert log_str == stock_str + "  memory: 7"  # MiB, at the end of mmengine's line
    assert tag == dict(stock_tag, memory=7)
    torch.gcu.max_memory_allocated.assert_called_once_with(3)  # this rank's card
    torch.gcu.reset_peak_memory_stats.assert_called_once_with(3)


def test_gcu1_logs_the_memory_allocated_now(monkeypatch, runner):
    accelerator = fakes.gcu1(monkeypatch, current=2)
    accelerator.torch_gcu.get_hbm_alloc_size.return_value = 12 * MiB

    tag, log_str = line(runner, accelerator)

    assert log_str.endswith("loss: 0.5000  memory: 12")
    assert tag["memory"] == 12
    accelerator.torch_gcu.get_hbm_alloc_size.assert_called_once_with(2)


@pytest.mark.parametrize("kind", ["cpu", "cuda"])
def test_off_a_gcu_the_line_is_mmengines(monkeypatch, runner, kind):
    accelerator = fakes.ACCELERATORS[kind](monkeypatch)  # CUDA is available for 'cuda'
    monkeypatch.setattr(accelerator, "peak_memory", lambda index: pytest.fail("memory read"))
    monkeypatch.setattr(LogProcessor, "_get_max_memory", lambda self, runner: 42)

    assert line(runner, accelerator) == stock_line(runner)


def test_a_memory_column_mmengine_wrote_is_kept(monkeypatch, runner):
    """Where mmengine itself logs memory (CUDA available), there is no second column."""
    accelerator = fakes.gcu2(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(LogProcessor, "_get_max_memory", lambda self, runner: 99)

    tag, log_str = line(runner, accelerator)

    assert tag["memory"] == 99 and log_str.count("memory:") == 1
    torch.gcu.max_memory_allocated.assert_not_called()


def test_no_figure_no_column(monkeypatch, runner):
    accelerator = fakes.gcu2(monkeypatch)
    monkeypatch.setattr(accelerator, "peak_memory", lambda index: None)

    tag, log_str = line(runner, accelerator)

    assert "memory" not in tag and "memory" not in log_str


@pytest.mark.usefixtures("fresh_notes")
def test_under_a_plain_runner_it_is_mmengines_processor(runner_case):
    """The crash of mmseg's stock tools/test.py on a GCU config ("'Runner' object has no
    attribute 'accelerator'" at the first log line) does not happen: the line is stock."""
    cfg = copy.deepcopy(runner_case.iter_based_cfg)
    cfg.train_cfg = dict(by_epoch=False, max_iters=2)
    cfg.log_processor = dict(type="GCULogProcessor", by_epoch=False)
    runner = runner_case.build_runner(cfg)
    assert type(runner) is Runner and type(runner.log_processor) is GCULogProcessor

    runner.train()

    stock = LogProcessor(by_epoch=False).get_log_after_iter(runner, 1, "train")
    assert runner.log_processor.get_log_after_iter(runner, 1, "train") == stock
    log = run_log(runner)
    assert "Iter(train) [2/2]" in log
    assert log.count("GCULogProcessor acts as mmengine's LogProcessor: it was not built") == 1

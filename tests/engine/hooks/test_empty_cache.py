"""GCUEmptyCacheHook: EmptyCacheHook's options, the card's cache, and 1.x's lack of one;
mmengine's hook off a GCU card."""

import copy
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from mmengine.hooks import EmptyCacheHook

from mmgcu.binding import Binding
from mmgcu.engine.hooks import GCUEmptyCacheHook
from tests import fakes
from tests.conftest import run_log


def make_runner(accelerator):
    """A stand-in runner; ``accelerator`` is what GCURunner would bind to the hook."""
    return SimpleNamespace(accelerator=accelerator, logger=mock.Mock())


def bound(runner, **options):
    hook = GCUEmptyCacheHook(**options)
    hook.bind(Binding(runner.accelerator))
    return hook


def run_a_short_epoch(hook, runner, mode="train"):
    """The hook calls of one epoch of two iterations."""
    getattr(hook, f"before_{mode}_epoch")(runner)
    for i in range(2):
        getattr(hook, f"after_{mode}_iter")(runner, i)
    getattr(hook, f"after_{mode}_epoch")(runner, **({} if mode == "train" else {"metrics": {}}))


@pytest.mark.parametrize(
    "options, emptied",
    [
        ({}, 1),  # EmptyCacheHook's default: after each epoch
        (dict(before_epoch=True), 2),
        (dict(after_iter=True, after_epoch=False), 2),
        (dict(before_epoch=True, after_iter=True), 4),
        (dict(after_epoch=False), 0),
    ],
)
@pytest.mark.parametrize("mode", ["train", "val", "test"])
def test_gcu2_empties_the_card_cache_as_configured(monkeypatch, options, emptied, mode):
    runner = make_runner(fakes.gcu2(monkeypatch))

    run_a_short_epoch(bound(runner, **options), runner, mode)

    assert torch.gcu.empty_cache.call_count == emptied
    runner.logger.info.assert_not_called()


def test_it_is_an_empty_cache_hook():
    assert issubclass(GCUEmptyCacheHook, EmptyCacheHook)


def test_gcu1_has_no_cache_and_says_so_once(monkeypatch):
    runner = make_runner(fakes.gcu1(monkeypatch))
    hook = bound(runner, after_iter=True)

    run_a_short_epoch(hook, runner)
    run_a_short_epoch(hook, runner, "val")

    fmt, description = runner.logger.info.call_args.args
    assert runner.logger.info.call_count == 1
    assert fmt % description == (
        "GCUEmptyCacheHook: torch_gcu 2.5.136 (1.x, XLA 'xla') has no cache to empty; "
        "the hook does nothing"
    )


def test_each_hook_says_it_once(monkeypatch):
    runner = make_runner(fakes.gcu1(monkeypatch))
    for _ in range(2):
        run_a_short_epoch(bound(runner), runner)
    assert runner.logger.info.call_count == 2


@pytest.fixture
def cuda_empty_cache(monkeypatch):
    """What mmengine's EmptyCacheHook calls where it finds CUDA, recorded."""
    recorder = mock.Mock()
    monkeypatch.setattr("mmengine.hooks.empty_cache_hook.is_cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", recorder)
    return recorder


@pytest.mark.usefixtures("fresh_notes")
def test_under_a_plain_runner_it_is_mmengines_hook(runner_case, cuda_empty_cache):
    cfg = copy.deepcopy(runner_case.iter_based_cfg)
    cfg.train_cfg = dict(by_epoch=False, max_iters=3)
    cfg.val_dataloader = cfg.val_cfg = cfg.val_evaluator = None  # training iterations only
    cfg.custom_hooks = [dict(type="GCUEmptyCacheHook", after_iter=True, after_epoch=False)]
    runner = runner_case.build_runner(cfg)

    runner.train()

    assert cuda_empty_cache.call_count == 3  # what EmptyCacheHook does after each iteration
    assert run_log(runner).count("GCUEmptyCacheHook acts as mmengine's EmptyCacheHook") == 1


@pytest.mark.usefixtures("fresh_notes")
def test_on_the_cpu_it_is_mmengines_hook(cuda_empty_cache):
    runner = make_runner(fakes.cpu())
    run_a_short_epoch(bound(runner, after_iter=True), runner)
    assert cuda_empty_cache.call_count == 3  # two iterations and the epoch's end
    runner.logger.info.assert_not_called()

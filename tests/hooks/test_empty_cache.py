"""GCUEmptyCacheHook: EmptyCacheHook's options, the card's cache, and 1.x's lack of one."""

from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from mmengine.hooks import EmptyCacheHook

from mmgcu.hooks import GCUEmptyCacheHook
from tests import fakes


def make_runner(accelerator):
    return SimpleNamespace(accelerator=accelerator, logger=mock.Mock())


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

    run_a_short_epoch(GCUEmptyCacheHook(**options), runner, mode)

    assert torch.gcu.empty_cache.call_count == emptied
    runner.logger.info.assert_not_called()


def test_it_is_an_empty_cache_hook():
    assert issubclass(GCUEmptyCacheHook, EmptyCacheHook)


def test_gcu1_has_no_cache_and_says_so_once(monkeypatch):
    runner = make_runner(fakes.gcu1(monkeypatch))
    hook = GCUEmptyCacheHook(after_iter=True)

    run_a_short_epoch(hook, runner)
    run_a_short_epoch(hook, runner, "val")

    fmt, description = runner.logger.info.call_args.args
    assert runner.logger.info.call_count == 1
    assert fmt % description == (
        "GCUEmptyCacheHook: torch_gcu 2.5.136 (1.x, XLA 'xla') has no cache to empty; "
        "the hook does nothing"
    )


def test_each_hook_says_it_once(monkeypatch):
    runner = make_runner(fakes.cpu())
    for _ in range(2):
        run_a_short_epoch(GCUEmptyCacheHook(), runner)
    assert runner.logger.info.call_count == 2

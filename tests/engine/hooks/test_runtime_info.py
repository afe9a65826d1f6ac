"""GCURuntimeInfoHook under mmengine's own Runner: its hub is a stock MessageHub, and the
hook is mmengine's RuntimeInfoHook (the card hub: tests/engine/test_message_hub.py)."""

import copy

import pytest
from mmengine.hooks import RuntimeInfoHook
from mmengine.runner import Runner

from mmgcu.engine.hooks import GCURuntimeInfoHook


@pytest.mark.parametrize("hook_type", ["RuntimeInfoHook", "GCURuntimeInfoHook"])
def test_under_a_plain_runner_it_records_what_the_stock_hook_does(runner_case, hook_type):
    cfg = copy.deepcopy(runner_case.iter_based_cfg)
    cfg.train_cfg = dict(by_epoch=False, max_iters=3, val_interval=3)
    cfg.default_hooks.runtime_info = dict(type=hook_type)
    runner = runner_case.build_runner(cfg)
    assert type(runner) is Runner

    runner.train()

    (hook,) = [h for h in runner.hooks if isinstance(h, RuntimeInfoHook)]
    assert (type(hook) is GCURuntimeInfoHook) == (hook_type == "GCURuntimeInfoHook")
    assert len(runner.message_hub.get_scalar("train/loss").data[0]) == 3
    assert runner.message_hub.get_info("iter") == 2
    assert "val/acc" in runner.message_hub.log_scalars

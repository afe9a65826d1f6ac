"""GCURuntimeInfoHook under mmengine's own Runner: its hub is a stock MessageHub, and the
hook is mmengine's RuntimeInfoHook (the card hub: tests/engine/test_message_hub.py); bound to
a card, it ends each iteration there."""

import copy
import types
from unittest import mock

import pytest
import torch
from mmengine.hooks import RuntimeInfoHook
from mmengine.runner import Runner

from mmgcu.binding import Binding
from mmgcu.engine.hooks import GCURuntimeInfoHook
from mmgcu.engine.message_hub import CardMessageHub


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


@pytest.mark.parametrize("lazy", [True, False], ids=["lazy card", "eager card"])
def test_it_ends_each_iteration_on_the_card(lazy):
    """A lazy card's iteration graph runs at the hook, with the stack of the iteration's
    scalars among its outputs (so the log reads them without a graph); an eager card's
    hub keeps its scalars for one stack per log line."""
    hub = mock.create_autospec(CardMessageHub, instance=True)
    hub.seal.return_value = ["stack"]
    hub.has_new_keys.return_value = False
    accelerator = mock.Mock(lazy=lazy, is_gcu=True, kind="gcu1" if lazy else "gcu2")
    hook = GCURuntimeInfoHook()
    hook.bind(Binding(accelerator))
    runner = types.SimpleNamespace(message_hub=hub)

    hook.after_train_iter(runner, 0, None, dict(loss=torch.zeros(())))

    hub.update_scalar.assert_called_once()
    if lazy:
        accelerator.finish_step.assert_called_once_with(["stack"])
    else:
        hub.seal.assert_not_called()
        accelerator.finish_step.assert_called_once_with(())

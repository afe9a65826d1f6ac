"""CPUCheckpointHook and GCUCheckpointHook: a checkpoint holds CPU tensors and plain values
only, and the hooks work under any runner.

A card tensor is stood for by :class:`CardTensor`, whose ``cpu()`` answers a plain tensor.
(:func:`mmgcu.checkpoint.plain.plain` itself: ``tests/checkpoint/test_plain.py``.)
"""

import copy
import os

import numpy as np
import torch
from mmengine.logging import HistoryBuffer
from mmengine.registry import HOOKS
from mmengine.runner import Runner

from mmgcu.checkpoint.hooks import CPUCheckpointHook
from tests.conftest import run_log


class CardTensor(torch.Tensor):
    """A tensor on a card, as far as the hook can tell: ``cpu()`` copies it off."""

    def cpu(self, *args, **kwargs):
        return self.as_subclass(torch.Tensor).clone()


def on_card(*values):
    return torch.tensor(values, dtype=torch.float32).as_subclass(CardTensor)


def on_the_cpu(obj):
    """Whether no CardTensor is left anywhere in ``obj``."""
    if isinstance(obj, torch.Tensor):
        return type(obj) is torch.Tensor
    if isinstance(obj, dict):
        return all(on_the_cpu(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return all(on_the_cpu(v) for v in obj)
    return True


def test_the_hook_moves_what_other_hooks_added():
    checkpoint = {
        "meta": {"epoch": 1, "seed": np.int64(3)},
        "state_dict": {"w": torch.ones(1)},
        "ema_state_dict": {"w": on_card(1.0)},  # an EMA hook's addition, left on the card
        "extra": [on_card(2.0)],
    }
    same = checkpoint

    CPUCheckpointHook().before_save_checkpoint(runner=None, checkpoint=checkpoint)

    assert checkpoint is same and on_the_cpu(checkpoint)
    assert checkpoint["meta"] == {"epoch": 1, "seed": 3} and type(checkpoint["meta"]["seed"]) is int
    assert torch.equal(checkpoint["ema_state_dict"]["w"], torch.tensor([1.0]))


def test_the_hook_restores_the_message_hub_after_a_load():
    buffer = HistoryBuffer([0.5, 0.25], [1, 1])
    checkpoint = {"message_hub": {"log_scalars": {"train/loss": buffer}, "runtime_info": {}}}
    CPUCheckpointHook().before_save_checkpoint(runner=None, checkpoint=checkpoint)
    assert isinstance(checkpoint["message_hub"]["log_scalars"]["train/loss"], dict)

    CPUCheckpointHook().after_load_checkpoint(runner=None, checkpoint=checkpoint)

    restored = checkpoint["message_hub"]["log_scalars"]["train/loss"]
    assert isinstance(restored, HistoryBuffer) and restored.current() == 0.25


def test_the_hook_runs_after_the_others():
    assert CPUCheckpointHook.priority == "LOWEST"
    assert HOOKS.get("CPUCheckpointHook") is CPUCheckpointHook


def test_under_a_plain_runner_the_hooks_save_and_resume(runner_case):
    """A config listing both hooks, run by mmengine's own Runner: plain checkpoints, the
    previous one removed after the new one is recorded, and a resume that continues."""
    cfg = copy.deepcopy(runner_case.iter_based_cfg)
    cfg.train_cfg = dict(by_epoch=False, max_iters=4)
    cfg.default_hooks.checkpoint = dict(
        type="GCUCheckpointHook", interval=2, by_epoch=False, max_keep_ckpts=1
    )
    cfg.custom_hooks = [dict(type="CPUCheckpointHook")]
    runner = runner_case.build_runner(cfg)
    assert type(runner) is Runner

    runner.train()

    work = runner.work_dir
    assert sorted(f for f in os.listdir(work) if f.endswith(".pth")) == ["iter_4.pth"]
    with open(os.path.join(work, "last_checkpoint")) as f:
        assert f.read() == os.path.join(work, "iter_4.pth")
    saved = torch.load(os.path.join(work, "iter_4.pth"), map_location="cpu")
    assert isinstance(saved["message_hub"]["log_scalars"]["train/loss"], dict)

    cfg.train_cfg = dict(by_epoch=False, max_iters=6)
    cfg.resume = True
    resumed = runner_case.build_runner(cfg)
    resumed.train()

    assert "resumed epoch: 0, iter: 4" in run_log(resumed)
    assert len(resumed.message_hub.get_scalar("train/loss").data[0]) == 6

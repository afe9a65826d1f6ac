"""What checkpoints pickle. mmgcu's are plain (CPU tensors, Python values): any torch.load
reads them, whatever its numpy, and the message hub comes back whole. Older ones (mmengine
0.10.7's) load on torch >= 2.6 with torch's allow-list of globals: what such a checkpoint
needs loads, anything else is refused with its name, and nothing process-wide (an
environment variable, a warning) is involved."""

import collections
import copy
import os
import pickle
import warnings

import numpy as np
import pytest
import torch
from mmengine.logging import HistoryBuffer, MessageHub
from mmengine.runner.checkpoint import _load_checkpoint

from mmgcu import GCURunner
from mmgcu.checkpoint.plain import (
    checkpoint_globals,
    history_buffer_getattr,
    mmengine_checkpoint_globals,
    plain,
    restore_message_hub,
    restricted_by_default,
)
from mmgcu.device import GCUError
from tests.conftest import run_log

restricted = pytest.mark.skipif(
    not restricted_by_default(), reason="torch < 2.6 unpickles everything by default"
)


def mmengine_checkpoint(path):
    """What mmengine's Runner.save_checkpoint writes: weights, optimizer, the message hub
    (HistoryBuffers of float and int arrays), meta with numpy scalars."""
    hub = MessageHub.get_instance("mmgcu-test-checkpoint")
    for i in range(3):
        hub.update_scalar("train/loss", 1.0 / (i + 1))
        hub.update_scalar("train/iter", i, count=2)
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    meta = dict(epoch=0, iter=3, seed=np.int64(7), mmengine_version="0.10.7")
    torch.save(
        dict(
            meta=meta,
            state_dict=model.state_dict(),
            optimizer=optimizer.state_dict(),
            message_hub=hub.state_dict(),
        ),
        path,
    )
    return str(path)


class Gadget:
    """An object whose pickle calls getattr on an allowed class for something else."""

    def __reduce__(self):
        return (getattr, (np.ndarray, "tofile"))


@restricted
def test_the_globals_are_exactly_those_of_an_mmengine_checkpoint(tmp_path):
    path = mmengine_checkpoint(tmp_path / "iter_3.pth")
    needed = set(torch.serialization.get_unsafe_globals_in_checkpoint(path))
    assert needed <= {
        "builtins.getattr",
        "mmengine.logging.history_buffer.HistoryBuffer",
        "numpy.dtype",
        "numpy.ndarray",
        "numpy._core.multiarray._reconstruct",
        "numpy._core.multiarray.scalar",
        "numpy.core.multiarray._reconstruct",
        "numpy.core.multiarray.scalar",
    }
    assert "builtins.getattr" in needed  # HistoryBuffer's table of statistics methods


@restricted
def test_mmengine_checkpoint_loads_without_touching_the_process(tmp_path):
    path = mmengine_checkpoint(tmp_path / "iter_3.pth")
    with pytest.raises(Exception, match="Weights only load failed"):
        torch.load(path, map_location="cpu")  # what mmengine 0.10.7 does on its own
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with mmengine_checkpoint_globals(path):
            checkpoint = _load_checkpoint(path, map_location="cpu")
    assert not [w for w in said if "WEIGHTS_ONLY" in str(w.message)]
    assert "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD" not in os.environ
    loss = checkpoint["message_hub"]["log_scalars"]["train/loss"]
    assert isinstance(loss, HistoryBuffer) and loss.current() == pytest.approx(1 / 3)
    assert loss.statistics("mean") == pytest.approx((1 + 1 / 2 + 1 / 3) / 3)
    assert checkpoint["meta"]["seed"] == 7
    # The allow-list was for that load only.
    with pytest.raises(Exception, match="Weights only load failed"):
        torch.load(path, map_location="cpu")


@restricted
def test_getattr_serves_only_history_buffer_statistics():
    assert history_buffer_getattr(HistoryBuffer, "mean") is HistoryBuffer.mean
    for obj, name in [(HistoryBuffer, "__init__"), (np.ndarray, "tofile"), (os, "system")]:
        with pytest.raises(Exception, match="only HistoryBuffer's statistics methods"):
            history_buffer_getattr(obj, name)
    names = [g[1] if isinstance(g, tuple) else g for g in checkpoint_globals()]
    assert getattr not in [g[0] if isinstance(g, tuple) else g for g in checkpoint_globals()]
    assert "builtins.getattr" in names


@restricted
def test_anything_else_is_refused_with_its_name(tmp_path):
    gadget = tmp_path / "gadget.pth"
    torch.save({"state_dict": {}, "x": Gadget()}, gadget)
    with pytest.raises(GCUError, match="gadget.pth pickles an object .*getattr"):
        with mmengine_checkpoint_globals(str(gadget)):
            _load_checkpoint(str(gadget), map_location="cpu")
    other = tmp_path / "other.pth"
    torch.save({"state_dict": {}, "x": warnings.WarningMessage}, other)
    with pytest.raises(GCUError, match="GLOBAL warnings.WarningMessage"):
        with mmengine_checkpoint_globals(str(other)):
            _load_checkpoint(str(other), map_location="cpu")


# -- plain checkpoints ------------------------------------------------------------------------


class CardTensor(torch.Tensor):
    """A tensor on a card, as far as ``plain`` can tell: ``cpu()`` copies it off."""

    def cpu(self, *args, **kwargs):
        return self.as_subclass(torch.Tensor).clone()


def on_card(*values):
    return torch.tensor(values, dtype=torch.float32).as_subclass(CardTensor)


def only_plain(obj) -> bool:
    """Whether ``obj`` holds nothing but CPU tensors and plain Python values."""
    if isinstance(obj, torch.Tensor):
        return type(obj) is torch.Tensor and obj.device.type == "cpu"
    if isinstance(obj, dict):
        return type(obj) in (dict, collections.OrderedDict) and all(
            only_plain(k) and only_plain(v) for k, v in obj.items()
        )
    if isinstance(obj, (list, tuple)):
        return type(obj) in (list, tuple) and all(only_plain(v) for v in obj)
    return obj is None or type(obj) in (bool, int, float, str, bytes)


Point = collections.namedtuple("Point", "x y")


def test_plain_moves_tensors_and_unwraps_numpy_and_named_tuples():
    nested = {
        "a": on_card(1.0),
        "b": [on_card(2.0), (np.float64(0.5), "text")],
        np.int64(3): np.arange(3),
        "p": Point(on_card(3.0), np.int32(2)),
    }

    made = plain(nested)

    assert only_plain(made) and not only_plain(nested)  # the original is left as it was
    assert torch.equal(made["b"][0], torch.tensor([2.0]))
    assert made["b"][1] == (0.5, "text") and type(made["b"][1][0]) is float
    assert made[3] == [0, 1, 2] and type(made["p"]) is tuple and made["p"][1] == 2


def test_plain_keeps_an_ordered_state_dict_and_its_versions():
    state = torch.nn.BatchNorm1d(2).state_dict()
    made = plain(state)
    assert type(made) is collections.OrderedDict and list(made) == list(state)
    assert made._metadata == state._metadata  # BatchNorm's version, read when loading


def test_a_history_buffer_round_trips():
    buffer = HistoryBuffer(max_length=5)
    for i in range(7):
        buffer.update(i / 2, count=i + 1)
    checkpoint = dict(message_hub=dict(log_scalars={"train/loss": plain(buffer)}))
    assert only_plain(checkpoint)

    loss = restore_message_hub(copy.deepcopy(checkpoint))["message_hub"]["log_scalars"][
        "train/loss"
    ]

    assert isinstance(loss, HistoryBuffer) and loss.max_length == 5
    for restored, original in zip(loss.data, buffer.data):
        np.testing.assert_array_equal(restored, original)
    assert loss.mean(3) == buffer.mean(3)


def test_an_older_checkpoints_hub_is_left_as_it_is():
    buffer = HistoryBuffer([1.0], [1])
    checkpoint = dict(message_hub=dict(log_scalars={"train/loss": buffer}), meta={})
    assert restore_message_hub(checkpoint)["message_hub"]["log_scalars"]["train/loss"] is buffer
    assert restore_message_hub(dict(state_dict={})) == dict(state_dict={})


def write_checkpoint(case):
    """A checkpoint GCURunner (on the CPU) wrote after 4 iterations, and its runner."""
    cfg = copy.deepcopy(case.iter_based_cfg)
    cfg.train_cfg = dict(by_epoch=False, max_iters=4)
    cfg.default_hooks.checkpoint = dict(type="CheckpointHook", interval=4, by_epoch=False)
    cfg.env_cfg = dict(device="cpu")
    cfg.experiment_name = case.experiment_name
    runner = GCURunner.from_cfg(cfg)
    runner.train()
    return os.path.join(runner.work_dir, "iter_4.pth"), runner


def test_gcu_runner_writes_only_plain_values(runner_case):
    path, _ = write_checkpoint(runner_case)

    checkpoint = torch.load(path, map_location="cpu")  # weights_only=True on torch >= 2.6

    assert only_plain(checkpoint)
    loss = checkpoint["message_hub"]["log_scalars"]["train/loss"]
    assert sorted(loss) == ["count_history", "log_history", "max_length"]
    assert len(loss["log_history"]) == 4
    if hasattr(torch.serialization, "get_unsafe_globals_in_checkpoint"):
        assert torch.serialization.get_unsafe_globals_in_checkpoint(path) == []


def test_its_pickle_names_no_numpy_module(runner_case):
    """numpy 2 names numpy._core, which numpy 1.x has not: none may appear."""
    path, _ = write_checkpoint(runner_case)
    with open(path, "rb") as f:
        raw = f.read()
    assert b"numpy" not in raw and b"HistoryBuffer" not in raw


def test_a_resume_restores_the_message_hub(runner_case):
    path, first = write_checkpoint(runner_case)
    logged = first.message_hub.get_scalar("train/loss").data[0]
    cfg = copy.deepcopy(first.cfg)
    cfg.train_cfg = dict(by_epoch=False, max_iters=6)
    cfg.load_from, cfg.resume = path, True
    cfg.experiment_name = runner_case.experiment_name

    second = GCURunner.from_cfg(cfg)
    second.train()

    assert "resumed epoch: 0, iter: 4" in run_log(second)
    loss = second.message_hub.get_scalar("train/loss")
    assert isinstance(loss, HistoryBuffer)
    assert len(loss.data[0]) == 6  # four restored, two trained now
    np.testing.assert_array_equal(loss.data[0][:4], logged)


def test_the_hook_makes_what_other_hooks_added_plain(runner_case):
    """An EMA hook's state left on the card is moved off, numpy values unwrapped."""
    path, runner = write_checkpoint(runner_case)
    checkpoint = {"meta": {"seed": np.int64(1)}, "ema": {"w": on_card(1.0)}}
    runner.call_hook("before_save_checkpoint", checkpoint=checkpoint)
    assert only_plain(checkpoint) and checkpoint["meta"]["seed"] == 1
    assert pickle.loads(pickle.dumps(checkpoint))["ema"]["w"].tolist() == [1.0]

"""Loading mmengine 0.10.7 checkpoints on torch >= 2.6 with torch's allow-list of globals:
what such a checkpoint needs loads, anything else is refused with its name, and nothing
process-wide (an environment variable, a warning) is involved."""

import os
import warnings

import numpy as np
import pytest
import torch
from mmengine.logging import HistoryBuffer, MessageHub
from mmengine.runner.checkpoint import _load_checkpoint

from mmgcu.checkpoint_globals import (
    checkpoint_globals,
    history_buffer_getattr,
    mmengine_checkpoint_globals,
    restricted_by_default,
)
from mmgcu.device import GCUError

pytestmark = pytest.mark.skipif(
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


def test_getattr_serves_only_history_buffer_statistics():
    assert history_buffer_getattr(HistoryBuffer, "mean") is HistoryBuffer.mean
    for obj, name in [(HistoryBuffer, "__init__"), (np.ndarray, "tofile"), (os, "system")]:
        with pytest.raises(Exception, match="only HistoryBuffer's statistics methods"):
            history_buffer_getattr(obj, name)
    names = [g[1] if isinstance(g, tuple) else g for g in checkpoint_globals()]
    assert getattr not in [g[0] if isinstance(g, tuple) else g for g in checkpoint_globals()]
    assert "builtins.getattr" in names


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

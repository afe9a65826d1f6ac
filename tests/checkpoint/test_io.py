"""GCUCheckpointIO: atomic saves, a damaged file named, mmengine's globals allowed per load."""

import os

import pytest
import torch

from mmgcu.checkpoint.io import GCUCheckpointIO
from mmgcu.device import GCUError


def writer(out_dir, fail=None):
    """mmengine's save as a writer of ``out_dir/name`` (or a failure after a partial write)."""
    calls = []

    def write(name):
        calls.append(name)
        with open(os.path.join(out_dir, name), "w") as f:
            f.write("partial" if fail else "new")
        if fail:
            raise fail

    write.calls = calls
    return write


def test_a_checkpoint_is_written_then_renamed(tmp_path):
    (tmp_path / "iter_4.pth").write_text("old")
    write = writer(tmp_path)

    GCUCheckpointIO().save(write, str(tmp_path), "iter_4.pth")

    assert write.calls == [".iter_4.pth.partial"]
    assert (tmp_path / "iter_4.pth").read_text() == "new"
    assert sorted(os.listdir(tmp_path)) == ["iter_4.pth"]


def test_a_failed_write_keeps_the_previous_checkpoint(tmp_path):
    (tmp_path / "iter_4.pth").write_text("old")

    with pytest.raises(OSError, match="No space left"):
        GCUCheckpointIO().save(
            writer(tmp_path, OSError(28, "No space left on device")), str(tmp_path), "iter_4.pth"
        )

    assert (tmp_path / "iter_4.pth").read_text() == "old"
    assert sorted(os.listdir(tmp_path)) == ["iter_4.pth"]  # the partial file is gone


def test_a_remote_checkpoint_is_written_by_its_backend(tmp_path):
    calls = []
    GCUCheckpointIO().save(calls.append, "http://host/work", "iter_4.pth")
    # a folder name without a prefix, whose backend_args name another backend
    GCUCheckpointIO().save(calls.append, str(tmp_path), "iter_8.pth", dict(backend="http"))
    # a prefix mmengine's backends do not know (the deprecated FileClient may)
    GCUCheckpointIO().save(calls.append, "custom://team/work", "iter_9.pth")
    assert calls == ["iter_4.pth", "iter_8.pth", "iter_9.pth"]  # not a partial name to rename


def test_a_damaged_checkpoint_is_named(tmp_path):
    (tmp_path / "iter_4.pth").write_bytes(b"")

    with pytest.raises(GCUError, match="iter_4.pth"):
        GCUCheckpointIO().check(str(tmp_path / "iter_4.pth"), str(tmp_path))


def test_resume_takes_the_newest_complete_checkpoint(tmp_path):
    io = GCUCheckpointIO()
    path, note = io.resume_target(str(tmp_path))
    assert path is None and "training starts at iteration 0" in note

    for step in (2, 4):
        torch.save({"meta": {"iter": step}}, str(tmp_path / f"iter_{step}.pth"))
    (tmp_path / "iter_6.pth").write_bytes(b"")  # a save cut short: not complete

    path, note = io.resume_target(str(tmp_path))
    assert path == str(tmp_path / "iter_4.pth") and "iter_4.pth" in note


@pytest.mark.parametrize("previous", [None, "0"])
def test_loading_keeps_torchs_weights_only_check(monkeypatch, previous):
    """Loading allow-lists mmengine's globals for that load; it never turns torch's
    weights-only check off for the process (TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD)."""
    name = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"
    if previous is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, previous)

    with GCUCheckpointIO().loading("work/iter_4.pth"):
        assert os.environ.get(name) == previous

    assert os.environ.get(name) == previous

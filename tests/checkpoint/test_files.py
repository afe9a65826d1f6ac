"""Checkpoint files that cannot all be lost, and the choice of the one to resume from."""

import os
import os.path as osp
import time

import pytest
import torch

from mmgcu.checkpoint.files import (
    batch_change_message,
    damage,
    remove_partials,
    resume_target,
    save_atomically,
)
from mmgcu.device import GCUError


def torch_writer(folder):
    def write(name):
        torch.save({"w": torch.ones(2)}, osp.join(folder, name))

    return write


def checkpoint(folder, name, mtime=None):
    path = osp.join(folder, name)
    torch.save({"meta": {"name": name}}, path)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def test_a_save_is_written_under_a_partial_name_fsynced_then_renamed(tmp_path, fsynced):
    save_atomically(torch_writer(tmp_path), str(tmp_path), "iter_2.pth")
    assert os.listdir(tmp_path) == ["iter_2.pth"]
    # The partial file's data reach the disk before the rename, the folder's entry after it.
    assert fsynced == [str(tmp_path / ".iter_2.pth.partial"), str(tmp_path)]
    assert torch.load(tmp_path / "iter_2.pth")["w"].tolist() == [1.0, 1.0]


def test_a_failed_save_leaves_the_previous_file_and_no_partial(tmp_path):
    (tmp_path / "iter_2.pth").write_bytes(b"previous")

    def full_disk(name):
        (tmp_path / name).write_bytes(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        save_atomically(full_disk, str(tmp_path), "iter_2.pth")
    assert os.listdir(tmp_path) == ["iter_2.pth"]
    assert (tmp_path / "iter_2.pth").read_bytes() == b"previous"


def test_partial_files_of_killed_saves_are_removed(tmp_path):
    for name in (".iter_4.pth.partial", ".last_checkpoint.partial", "iter_2.pth", "keep.partial"):
        (tmp_path / name).write_bytes(b"x")
    assert remove_partials(str(tmp_path)) == [".iter_4.pth.partial", ".last_checkpoint.partial"]
    assert sorted(os.listdir(tmp_path)) == ["iter_2.pth", "keep.partial"]


def test_damage_names_empty_and_cut_short_files(tmp_path):
    good = checkpoint(tmp_path, "iter_2.pth")
    assert damage(good) is None
    (tmp_path / "empty.pth").write_bytes(b"")
    assert damage(str(tmp_path / "empty.pth")) == "it is empty (0 bytes)"
    with open(good, "rb") as f:
        (tmp_path / "cut.pth").write_bytes(f.read()[:100])
    assert "cut short" in damage(str(tmp_path / "cut.pth"))
    legacy = tmp_path / "legacy.pth"
    torch.save({"w": 1}, legacy, _use_new_zipfile_serialization=False)
    assert damage(str(legacy)) is None


def test_resume_takes_what_last_checkpoint_names(tmp_path):
    checkpoint(tmp_path, "iter_2.pth")
    named = checkpoint(tmp_path, "iter_4.pth")
    (tmp_path / "last_checkpoint").write_text(named)
    assert resume_target(str(tmp_path)) == (named, None)


@pytest.mark.parametrize(
    "last, why",
    [
        (None, "last_checkpoint does not exist"),
        ("", "last_checkpoint is empty"),
        ("{work}/iter_8.pth", "last_checkpoint names {work}/iter_8.pth, which does not exist"),
    ],
)
def test_resume_without_a_usable_last_checkpoint_takes_the_newest_complete(tmp_path, last, why):
    now = time.time()
    checkpoint(tmp_path, "iter_4.pth", mtime=now - 10)
    checkpoint(tmp_path, "iter_10.pth", mtime=now - 20)  # newest by step, older by mtime
    (tmp_path / "iter_12.pth").write_bytes(b"")  # newer, but damaged
    checkpoint(tmp_path, "best_mIoU_iter_14.pth")  # not a numbered checkpoint
    if last is not None:
        (tmp_path / "last_checkpoint").write_text(last.format(work=tmp_path))
    target, note = resume_target(str(tmp_path))
    assert target == str(tmp_path / "iter_10.pth")
    assert note == (
        f"{tmp_path}/{why.format(work=tmp_path)}; resuming from the newest complete "
        f"checkpoint, {tmp_path}/iter_10.pth"
    )


def test_resume_over_only_damaged_checkpoints_is_refused(tmp_path):
    (tmp_path / "iter_2.pth").write_bytes(b"")
    with pytest.raises(GCUError, match="iter_2.pth is damaged: it is empty"):
        resume_target(str(tmp_path))


def test_resume_in_an_empty_work_dir_starts_at_zero_and_says_so(tmp_path):
    target, note = resume_target(str(tmp_path))
    assert target is None and note.endswith("holds no checkpoint: training starts at iteration 0")


def test_a_change_of_global_batch_is_told_with_numbers():
    then, now = dict(ranks=8, per_rank=2), dict(ranks=4, per_rank=2)
    message = batch_change_message(then, now, [0.01])
    assert "global batch of 16 (8 rank(s) x 2); this run trains with 8 (4 rank(s) x 2)" in message
    assert "(lr=0.01, chosen for a batch of 16); the linear scaling rule would give lr=0.005" in (
        message
    )
    assert "launch 8 rank(s) or set train_dataloader.batch_size=4" in message
    assert "auto_scale_lr=dict(enable=True, base_batch_size=16)" in message
    assert batch_change_message(then, dict(ranks=4, per_rank=4), [0.01]) is None

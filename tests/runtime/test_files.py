"""mmgcu.runtime.files: files written whole or not at all, and per-rank JSON files."""

import json
import os

import pytest

from mmgcu.runtime.files import (
    rank_file,
    read_rank_files,
    write_json_atomically,
    write_text_atomically,
)


def test_last_checkpoint_is_replaced_never_rewritten_in_place(tmp_path, fsynced, monkeypatch):
    last = tmp_path / "last_checkpoint"
    last.write_text("/w/iter_2.pth")
    write_text_atomically(str(last), "/w/iter_4.pth")
    assert last.read_text() == "/w/iter_4.pth"
    assert fsynced == [str(tmp_path / ".last_checkpoint.partial"), str(tmp_path)]
    assert os.listdir(tmp_path) == ["last_checkpoint"]

    def crash(*args):
        raise KeyboardInterrupt  # killed between the write and the rename

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        write_text_atomically(str(last), "/w/iter_6.pth")
    assert last.read_text() == "/w/iter_4.pth"


def test_a_file_rewritten_every_few_seconds_is_not_fsynced(tmp_path, fsynced):
    write_json_atomically(rank_file(str(tmp_path), 3), dict(rank=3, step=7), durable=False)
    assert fsynced == []
    assert os.listdir(tmp_path) == ["rank3.json"]
    assert json.loads((tmp_path / "rank3.json").read_text()) == dict(rank=3, step=7)


def test_rank_files_are_read_by_rank_and_unreadable_ones_left_out(tmp_path):
    for rank in (0, 2):
        write_json_atomically(rank_file(str(tmp_path), rank), dict(rank=rank, ok=True))
    (tmp_path / "rank5.json").write_text('{"rank": 5, "ok"')  # cut short
    (tmp_path / "rank6.json").write_text("{}")  # no rank
    (tmp_path / "other.json").write_text('{"rank": 9}')

    assert read_rank_files(str(tmp_path)) == {0: dict(rank=0, ok=True), 2: dict(rank=2, ok=True)}
    assert read_rank_files(str(tmp_path / "missing")) == {}

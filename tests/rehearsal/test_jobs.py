"""The rehearsal's jobs: the work dir it clears (and what it refuses to clear), and a job
that runs on this node alone whatever the shell says of a job of several nodes."""

import json
import os
import socket

import pytest

from mmgcu.rehearsal.errors import RehearsalError
from mmgcu.rehearsal.jobs import MARK, Jobs, job_env, prepare_work_dir

PROGRAMS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "programs")


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "my_config.py"
    path.write_text("# the user's config\n")
    return str(path)


def test_a_new_or_empty_work_dir_is_made_ready(tmp_path, config):
    new = tmp_path / "work_dirs" / "new"
    prepare_work_dir(str(new), config)
    assert new.is_dir() and not list(new.iterdir())
    prepare_work_dir(str(new), config)  # empty: taken as it is
    assert new.is_dir()


def test_an_earlier_rehearsals_work_dir_is_cleared(tmp_path, config):
    work = tmp_path / "work"
    (work / "rehearsal").mkdir(parents=True)
    (work / MARK).write_text("{}")
    (work / "iter_3.pth").write_bytes(b"weights")
    (work / "rehearsal" / "rank0-train.json").write_text("{}")
    prepare_work_dir(str(work), config)
    assert work.is_dir() and not list(work.iterdir())


def test_a_folder_of_anything_else_is_refused_and_kept(tmp_path, config):
    work = tmp_path / "results"
    work.mkdir()
    (work / "best_mIoU.pth").write_bytes(b"a week of training")
    with pytest.raises(RehearsalError, match="is not empty and holds no earlier rehearsal"):
        prepare_work_dir(str(work), config)
    assert (work / "best_mIoU.pth").read_bytes() == b"a week of training"
    with pytest.raises(ValueError):  # what Python callers caught before RehearsalError
        prepare_work_dir(str(work), config)


def test_a_work_dir_that_holds_the_config_is_refused_and_kept(tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    (work / MARK).write_text("{}")  # even an earlier rehearsal's
    config = work / "configs" / "my_config.py"
    config.parent.mkdir()
    config.write_text("# the user's config\n")
    with pytest.raises(RehearsalError, match="is inside the work dir"):
        prepare_work_dir(str(work), str(config))
    assert config.read_text() == "# the user's config\n"
    # relative paths name the same folders
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RehearsalError, match="is inside the work dir"):
        prepare_work_dir("work", "work/configs/my_config.py")
    assert config.is_file()


def test_a_job_runs_on_this_node_alone_whatever_the_shell_says(tmp_path):
    """A shell set up as node 1 of a two-node job (and a PORT another store holds): the
    rehearsal's job takes a rendezvous of its own with its 2 simulated cards, and its
    ranks see none of that job's variables."""
    work = tmp_path / "work"
    work.mkdir()
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        shell = dict(
            os.environ,
            NNODES="2",
            NODE_RANK="1",
            MASTER_ADDR="10.255.0.1",
            PORT=port,
            MMGCU_SIMULATE_API="gcu2",
        )
        env = job_env(shell, "t20", 2, str(work), {"MALLOC_MMAP_THRESHOLD_": "1048576"})
        jobs = Jobs(str(work), 2, env, [os.path.join(PROGRAMS, "record_env.py")])
        code = jobs.run("train", "cfg.py", ["--cfg-options", "a=1"])
    assert code == 0, jobs.log(0)[-3000:]
    assert list(jobs.seconds) == ["train"] and jobs.codes == [0]
    for r in (0, 1):
        with open(work / f"env-rank{r}.json") as f:
            seen = json.load(f)
        assert seen["argv"] == ["cfg.py", "--work-dir", str(work), "--launcher", "pytorch"] + [
            "--cfg-options",
            "a=1",
        ]
        ranks = seen["env"]
        assert (ranks["WORLD_SIZE"], ranks["LOCAL_RANK"]) == ("2", str(r))
        assert not {"NNODES", "NODE_RANK", "PORT", "MMGCU_SIMULATE_API"} & set(ranks)
        assert ranks["MASTER_ADDR"] != "10.255.0.1" and ranks["MASTER_PORT"] != port
        assert ranks["MMGCU_SIMULATE"] == "t20:2"
        assert ranks["MMGCU_LOCK_DIR"] == str(work / "card-locks")
        assert ranks["MALLOC_MMAP_THRESHOLD_"] == "1048576"

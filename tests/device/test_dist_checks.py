"""Launcher checks in mmgcu.dist: the group backend, the local rank and the card choice."""

import datetime
import os
from unittest import mock

import pytest
import torch.distributed as torch_dist

from mmgcu import dist as mdist
from mmgcu.device import DeviceBackend, GCUError
from mmgcu.device.fallback import CpuBackend, CudaBackend
from mmgcu.device.legacy import GcuLegacyBackend
from mmgcu.device.v2 import GcuV2Backend
from tests.conftest import LAUNCHER_VARS


@pytest.fixture(autouse=True)
def launcher_env():
    """No launcher variables; init_distributed writes os.environ itself, so restore it all."""
    saved = dict(os.environ)
    for name in LAUNCHER_VARS:
        os.environ.pop(name, None)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def v2_backend(v2):
    return GcuV2Backend(v2.torch_gcu)


@pytest.fixture
def legacy_backend(legacy):
    return GcuLegacyBackend(legacy)


def fake_backend(cards=8, **attrs):
    backend = mock.Mock(spec=DeviceBackend)
    backend.device_count.return_value = cards
    backend.device_type = "gcu"
    backend.description = "fake torch_gcu"
    backend.is_gcu = True
    backend.default_group_backend = "cpu:gloo,gcu:eccl"
    backend.device_group_backend = None
    for name, value in attrs.items():
        setattr(backend, name, value)
    return backend


# -- resolve_backend ------------------------------------------------------------


@pytest.mark.parametrize("requested", [None, "", "auto", "nccl", "eccl"])
def test_device_backend_on_v2(v2_backend, requested):
    assert mdist.resolve_backend(requested, v2_backend) == "cpu:gloo,gcu:eccl"


@pytest.mark.parametrize("requested", [None, "nccl", "eccl"])
def test_device_backend_on_legacy(legacy_backend, requested):
    assert mdist.resolve_backend(requested, legacy_backend) == "gloo"


@pytest.mark.parametrize("requested", [None, "auto", "nccl"])
def test_device_backend_on_fallbacks(requested):
    assert mdist.resolve_backend(requested, CudaBackend()) == "nccl"
    assert mdist.resolve_backend(requested, CpuBackend()) == "gloo"


def test_eccl_without_a_gcu_is_refused():
    with pytest.raises(GCUError, match="backend='eccl' but no GCU was found") as err:
        mdist.resolve_backend("eccl", CpuBackend())
    assert CpuBackend.description in str(err.value)


def test_gloo_on_a_gcu_is_refused(v2_backend):
    with pytest.raises(GCUError, match="'gloo' cannot carry GCU tensors") as err:
        mdist.resolve_backend("gloo", v2_backend)
    assert "'cpu:gloo,gcu:eccl'" in str(err.value)  # what mmgcu would pick instead


def test_gloo_on_legacy_is_the_default_group_it_uses(legacy_backend):
    # Card tensors have their own ECCL group on 1.x, so a gloo default group is right.
    assert mdist.resolve_backend("gloo", legacy_backend) == "gloo"


def test_gloo_off_a_gcu_passes():
    assert mdist.resolve_backend("gloo", CpuBackend()) == "gloo"


@pytest.mark.parametrize("backend_factory", [CpuBackend, lambda: fake_backend()])
def test_other_backends_pass_through(backend_factory):
    assert mdist.resolve_backend("mpi", backend_factory()) == "mpi"


# -- local_rank / local_world_size ------------------------------------------------


@pytest.mark.parametrize(
    "launcher, env, rank",
    [
        ("pytorch", {"LOCAL_RANK": "3"}, 3),
        ("slurm", {"SLURM_LOCALID": "2", "LOCAL_RANK": "5"}, 2),
        ("slurm", {"LOCAL_RANK": "5"}, 5),
        ("mpi", {"OMPI_COMM_WORLD_LOCAL_RANK": "1", "LOCAL_RANK": "6"}, 1),
        ("mpi", {"LOCAL_RANK": "6"}, 6),
    ],
)
def test_local_rank(monkeypatch, launcher, env, rank):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert mdist.local_rank(launcher) == rank


def test_pytorch_ignores_slurm_and_mpi_variables(monkeypatch):
    monkeypatch.setenv("SLURM_LOCALID", "1")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1")
    with pytest.raises(GCUError, match="LOCAL_RANK is not set"):
        mdist.local_rank("pytorch")


@pytest.mark.parametrize(
    "launcher, names",
    [
        ("pytorch", "LOCAL_RANK"),
        ("slurm", "SLURM_LOCALID / LOCAL_RANK"),
        ("mpi", "OMPI_COMM_WORLD_LOCAL_RANK / LOCAL_RANK"),
    ],
)
def test_missing_local_rank_names_the_variables_and_the_launcher(launcher, names):
    with pytest.raises(GCUError) as err:
        mdist.local_rank(launcher)
    assert str(err.value).startswith(f"{names} is not set")
    assert f"--launcher {launcher}" in str(err.value)


@pytest.mark.parametrize("launcher, name", [("pytorch", "LOCAL_RANK"), ("slurm", "SLURM_LOCALID")])
def test_non_integer_local_rank(monkeypatch, launcher, name):
    monkeypatch.setenv(name, "one")
    with pytest.raises(GCUError, match=f"{name}='one' is not an integer"):
        mdist.local_rank(launcher)


@pytest.mark.parametrize(
    "launcher, name",
    [
        ("pytorch", "LOCAL_WORLD_SIZE"),
        ("slurm", "SLURM_NTASKS_PER_NODE"),
        ("mpi", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ],
)
def test_local_world_size(monkeypatch, launcher, name):
    assert mdist.local_world_size(launcher) is None
    monkeypatch.setenv(name, "4")
    assert mdist.local_world_size(launcher) == 4
    monkeypatch.setenv(name, "2(x3)")  # slurm's compressed form is not a plain count
    assert mdist.local_world_size(launcher) is None


# -- select_card ------------------------------------------------------------------


def test_select_card_makes_the_local_rank_current(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    backend = fake_backend(cards=8)
    assert mdist.select_card(backend, "pytorch") == 3
    backend.set_device.assert_called_once_with(3)


def test_select_card_with_slurm(monkeypatch):
    monkeypatch.setenv("SLURM_LOCALID", "1")
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "2")
    backend = fake_backend(cards=2)
    assert mdist.select_card(backend, "slurm") == 1
    backend.set_device.assert_called_once_with(1)


def test_more_ranks_than_cards_names_both_numbers(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "9")
    backend = fake_backend(cards=8)
    with pytest.raises(GCUError) as err:
        mdist.select_card(backend, "pytorch")
    message = str(err.value)
    assert "9 ranks were launched" in message and "only 8 GCU card(s)" in message
    assert "--nproc_per_node=8" in message
    backend.set_device.assert_not_called()


@pytest.mark.parametrize("rank", ["8", "-1"])
def test_local_rank_without_a_card(monkeypatch, rank):
    monkeypatch.setenv("LOCAL_RANK", rank)
    backend = fake_backend(cards=8)
    with pytest.raises(GCUError, match=f"local rank {rank} has no card") as err:
        mdist.select_card(backend, "pytorch")
    assert "0..7" in str(err.value) and "fake torch_gcu" in str(err.value)
    backend.set_device.assert_not_called()


def test_no_visible_cards_message_is_sensible(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(GCUError) as err:
        mdist.select_card(fake_backend(cards=0), "pytorch")
    assert "0..-1" not in str(err.value)
    assert "no card is visible to local rank 0" in str(err.value)


def test_unknown_launcher_is_refused_before_reading_the_environment():
    backend = fake_backend()
    with pytest.raises(GCUError, match="unknown launcher 'horovod'") as err:
        mdist.select_card(backend, "horovod")
    assert "pytorch, slurm, mpi" in str(err.value)
    backend.device_count.assert_not_called()


# -- init_distributed, with every collective mocked -----------------------------------


@pytest.fixture
def new_group(monkeypatch):
    monkeypatch.setattr(mdist, "_device_group", None)
    group = mock.Mock()
    monkeypatch.setattr(mdist.torch_dist, "new_group", group)
    return group


def test_init_distributed_on_v2(monkeypatch, new_group):
    monkeypatch.setenv("LOCAL_RANK", "2")
    backend = fake_backend()
    assert mdist.init_distributed(backend, "pytorch", dist_backend="nccl", timeout=30) == 2
    backend.set_device.assert_called_once_with(2)
    backend.check_dist_backend.assert_called_once_with()
    backend.import_distributed.return_value.init_process_group.assert_called_once_with(
        backend="cpu:gloo,gcu:eccl", timeout=datetime.timedelta(seconds=30)
    )
    new_group.assert_not_called()
    assert mdist.device_group() is None


def test_init_distributed_on_legacy_adds_a_device_group(monkeypatch, new_group):
    monkeypatch.setenv("LOCAL_RANK", "0")
    backend = fake_backend(default_group_backend="gloo", device_group_backend="eccl")
    mdist.init_distributed(backend, "pytorch")
    backend.import_distributed.return_value.init_process_group.assert_called_once_with(
        backend="gloo"
    )
    new_group.assert_called_once_with(backend="eccl", timeout=None)
    assert mdist.device_group() is new_group.return_value


def test_init_distributed_off_a_gcu_skips_the_eccl_check(monkeypatch, new_group):
    monkeypatch.setenv("LOCAL_RANK", "0")
    backend = fake_backend(cards=1, is_gcu=False, default_group_backend="gloo")
    mdist.init_distributed(backend, "pytorch")
    backend.check_dist_backend.assert_not_called()


def test_init_distributed_refuses_a_bad_rank_before_any_group(monkeypatch, new_group):
    monkeypatch.setenv("LOCAL_RANK", "8")
    backend = fake_backend(cards=8)
    with pytest.raises(GCUError):
        mdist.init_distributed(backend, "pytorch")
    backend.import_distributed.assert_not_called()


def test_slurm_environment(monkeypatch, new_group):
    monkeypatch.setenv("SLURM_PROCID", "5")
    monkeypatch.setenv("SLURM_NTASKS", "16")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    monkeypatch.setenv("SLURM_NODELIST", "node[1-2]")
    getoutput = mock.Mock(return_value="node1")
    monkeypatch.setattr(mdist.subprocess, "getoutput", getoutput)
    assert mdist.init_distributed(fake_backend(), "slurm", port=29600) == 1
    assert os.environ["RANK"] == "5" and os.environ["WORLD_SIZE"] == "16"
    assert os.environ["LOCAL_RANK"] == "1"
    assert os.environ["MASTER_PORT"] == "29600"
    assert os.environ["MASTER_ADDR"] == "node1"
    getoutput.assert_called_once_with("scontrol show hostname node[1-2] | head -n1")


def test_slurm_keeps_a_given_master(monkeypatch, new_group):
    for name, value in [("SLURM_PROCID", "0"), ("SLURM_NTASKS", "1"), ("SLURM_LOCALID", "0")]:
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setattr(mdist.subprocess, "getoutput", mock.Mock(side_effect=AssertionError))
    mdist.init_distributed(fake_backend(), "slurm")
    assert os.environ["MASTER_ADDR"] == "10.0.0.1" and os.environ["MASTER_PORT"] == "29500"


def test_mpi_environment(monkeypatch, new_group):
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "3")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3")
    assert mdist.init_distributed(fake_backend(), "mpi", port=29700) == 3
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"]) == (
        "3",
        "4",
        "3",
    )
    assert os.environ["MASTER_PORT"] == "29700" and os.environ["MASTER_ADDR"] == "127.0.0.1"


def test_mpi_keeps_a_given_master(monkeypatch, new_group):
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.2")
    monkeypatch.setenv("MASTER_PORT", "1234")
    mdist.init_distributed(fake_backend(), "mpi")
    assert os.environ["MASTER_ADDR"] == "10.0.0.2" and os.environ["MASTER_PORT"] == "1234"


@pytest.mark.parametrize("launcher", ["mpi", "slurm"])
def test_init_distributed_outside_the_launcher_is_a_gcu_error(new_group, launcher):
    with pytest.raises(GCUError, match=f"--launcher {launcher}"):
        mdist.init_distributed(fake_backend(), launcher)


# -- lost_peer -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "error,expected",
    [
        (RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:24968"), True),
        (RuntimeError("[pair.cc:589] Read error [127.0.0.1]: Connection reset by peer"), True),
        (RuntimeError("injected fault in rank 2"), False),
        (ValueError("Connection closed by peer"), False),  # not from a collective
    ],
)
def test_lost_peer_reads_gloo_errors(error, expected):
    assert mdist.lost_peer(error) is expected


@pytest.mark.skipif(not hasattr(torch_dist, "DistError"), reason="torch < 2.1")
def test_lost_peer_takes_a_backend_error():
    assert mdist.lost_peer(torch_dist.DistBackendError("ECCL watchdog: collective timed out"))

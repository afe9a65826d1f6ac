"""mmgcu.runtime.dist: the default group's backend, the local rank, the card and groups."""

import datetime
import os
from unittest import mock

import pytest
import torch
import torch.distributed as torch_dist

from mmgcu.compat import mmengine as compat
from mmgcu.device import GCUError
from mmgcu.runtime import dist as mdist
from tests import fakes
from tests.conftest import free_port

# No launcher variables; init_distributed writes os.environ, which the fixture restores.
pytestmark = pytest.mark.usefixtures("no_launcher_env")


@pytest.fixture
def events():
    return []


@pytest.fixture
def gcu2(monkeypatch, events):
    return fakes.gcu2(monkeypatch, cards=8, events=events)


@pytest.fixture
def gcu1(monkeypatch, events):
    return fakes.gcu1(monkeypatch, cards=8, events=events)


@pytest.fixture
def cpu():
    return fakes.cpu()


@pytest.fixture
def torch_groups(monkeypatch, events):
    """torch.distributed's group creation, recorded in ``events``."""

    def init_process_group(backend=None, **kwargs):
        events.append(("init_process_group", backend, kwargs))

    monkeypatch.setattr(torch_dist, "init_process_group", init_process_group)
    monkeypatch.setattr(torch_dist, "get_backend", lambda group=None: "fake")
    monkeypatch.setattr(torch_dist, "get_world_size", lambda group=None: 1)


@pytest.fixture
def agent_store(monkeypatch):
    """A store server as torchrun's agent keeps it across restarts, and the environment
    its workers get (attempt 1 of rank 1 in a world of 2)."""
    port = free_port()
    server = torch_dist.TCPStore("127.0.0.1", port, 1, True, datetime.timedelta(seconds=10))
    for name, value in dict(
        TORCHELASTIC_USE_AGENT_STORE="True",
        TORCHELASTIC_RESTART_COUNT="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK="1",
        WORLD_SIZE="2",
        LOCAL_RANK="0",
        GROUP_WORLD_SIZE="1",
    ).items():
        monkeypatch.setenv(name, value)
    return server


# -- pg_backend_for ------------------------------------------------------------------------


@pytest.mark.parametrize("requested", [None, "", "auto", "nccl", "eccl"])
def test_pg_backend_on_gcu2(gcu2, requested):
    assert mdist.pg_backend_for(requested, gcu2) == "cpu:gloo,gcu:eccl"


@pytest.mark.parametrize("requested", [None, "nccl", "eccl"])
def test_pg_backend_on_gcu1(gcu1, requested):
    # gloo for CPU tensors, torch_gcu.distributed's ECCL world for card tensors
    assert mdist.pg_backend_for(requested, gcu1) == "gloo_eccl"


@pytest.mark.parametrize("requested", [None, "auto", "nccl"])
def test_pg_backend_on_fallbacks(monkeypatch, cpu, requested):
    assert mdist.pg_backend_for(requested, fakes.cuda(monkeypatch)) == "nccl"
    assert mdist.pg_backend_for(requested, cpu) == "gloo"


def test_eccl_without_a_gcu_is_refused(cpu):
    with pytest.raises(GCUError, match="backend='eccl' but no GCU was found") as err:
        mdist.pg_backend_for("eccl", cpu)
    assert cpu.description in str(err.value)


def test_the_devices_own_backend_passes(gcu2, gcu1):
    assert mdist.pg_backend_for("cpu:gloo,gcu:eccl", gcu2) == "cpu:gloo,gcu:eccl"
    assert mdist.pg_backend_for("gloo_eccl", gcu1) == "gloo_eccl"


def test_gloo_on_gcu2_is_refused(gcu2):
    with pytest.raises(GCUError, match="'gloo' cannot carry GCU tensors") as err:
        mdist.pg_backend_for("gloo", gcu2)
    assert "'cpu:gloo,gcu:eccl'" in str(err.value)  # what mmgcu would pick instead


def test_gloo_on_gcu1_is_taken_as_asked(gcu1):
    # Card tensors have their own ECCL group on 1.x, so a gloo default group still trains
    # (only model code's own torch.distributed calls on card tensors then fail, named).
    assert mdist.pg_backend_for("gloo", gcu1) == "gloo"


def test_gloo_off_a_gcu_passes(cpu):
    assert mdist.pg_backend_for("gloo", cpu) == "gloo"


def test_other_backends_pass_through_off_a_gcu(cpu):
    assert mdist.pg_backend_for("mpi", cpu) == "mpi"


@pytest.mark.parametrize("kind", ["gcu2", "gcu1"])
def test_other_backends_are_refused_on_a_gcu(kind, request):
    with pytest.raises(GCUError, match="'mpi' cannot carry GCU tensors"):
        mdist.pg_backend_for("mpi", request.getfixturevalue(kind))


# -- local_rank / local_world_size -----------------------------------------------------------


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


# -- select_card -----------------------------------------------------------------------------


def test_select_card_makes_the_local_rank_current(monkeypatch, gcu2, events):
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert mdist.select_card(gcu2, "pytorch") == 3
    assert events == [("set_device", 3)]
    assert gcu2.current_device() == 3


def test_select_card_with_slurm(monkeypatch, events):
    accelerator = fakes.gcu1(monkeypatch, cards=2, events=events)
    monkeypatch.setenv("SLURM_LOCALID", "1")
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "2")
    assert mdist.select_card(accelerator, "slurm") == 1
    assert events == [("set_device", 1)]


def test_more_ranks_than_cards_names_both_numbers(monkeypatch, gcu2, events):
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "9")
    with pytest.raises(GCUError) as err:
        mdist.select_card(gcu2, "pytorch")
    message = str(err.value)
    assert "9 ranks were launched" in message and "only 8 GCU card(s)" in message
    assert "--nproc_per_node=8" in message
    assert events == []


def test_more_ranks_than_cuda_devices_says_devices(monkeypatch, events):
    accelerator = fakes.cuda(monkeypatch, cards=2, events=events)
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    with pytest.raises(GCUError, match="only 2 cuda device"):
        mdist.select_card(accelerator, "pytorch")


@pytest.mark.parametrize("rank", ["8", "-1"])
def test_local_rank_without_a_card(monkeypatch, gcu2, events, rank):
    monkeypatch.setenv("LOCAL_RANK", rank)
    with pytest.raises(GCUError, match=f"local rank {rank} has no card") as err:
        mdist.select_card(gcu2, "pytorch")
    assert "0..7" in str(err.value) and gcu2.description in str(err.value)
    assert events == []


def test_no_visible_cards_message_is_sensible(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(GCUError) as err:
        mdist.select_card(fakes.gcu2(monkeypatch, cards=0), "pytorch")
    assert "0..-1" not in str(err.value)
    assert "no card is visible to local rank 0" in str(err.value)


def test_unknown_launcher_is_refused_before_reading_the_environment(gcu2):
    with pytest.raises(GCUError, match="unknown launcher 'horovod'") as err:
        mdist.select_card(gcu2, "horovod")
    assert "pytorch, slurm, mpi" in str(err.value)
    torch.gcu.device_count.assert_not_called()


# -- init_distributed --------------------------------------------------------------------------


def test_init_distributed_chooses_the_card_before_the_group(
    monkeypatch, gcu2, events, torch_groups
):
    monkeypatch.setenv("LOCAL_RANK", "2")
    check = mock.Mock(side_effect=lambda: events.append(("check_collectives",)))
    monkeypatch.setattr(gcu2, "check_collectives", check)

    assert mdist.init_distributed(gcu2, "pytorch", pg_backend="nccl", timeout=30) == 2

    assert events == [
        ("set_device", 2),
        ("check_collectives",),
        (
            "init_process_group",
            "cpu:gloo,gcu:eccl",
            dict(timeout=datetime.timedelta(seconds=30)),
        ),
    ]
    assert gcu2.card_group.dist is torch_dist


def test_init_distributed_on_gcu1_adds_the_eccl_world(gcu1, events, torch_groups, agent_store):
    # torchrun's agent store: ECCL's ranks meet there.
    mdist.init_distributed(gcu1, "pytorch")

    assert [e[:2] for e in events] == [
        ("set_device", 0),
        ("init_process_group", "gloo_eccl"),  # card tensors of model code: the ECCL world
        ("eccl init_process_group", "eccl"),
    ]
    assert gcu1.card_group.dist is gcu1.torch_gcu.distributed
    assert gcu1.routes.group is gcu1.card_group.group


def test_under_torchruns_agent_store_the_keys_are_the_attempts_own(
    cpu, events, torch_groups, agent_store
):
    """After a restart the agent's store still holds the previous attempt's keys (gloo's
    peer addresses): the group's store writes and reads this attempt's only."""
    agent_store.set("default_pg/0//cpu/rank_0", "address of attempt 0")

    mdist.init_distributed(cpu, "pytorch", timeout=10)

    ((_, backend, kwargs),) = events
    assert (backend, kwargs["rank"], kwargs["world_size"]) == ("gloo", 1, 2)
    store = kwargs["store"]
    store.set("default_pg/0//cpu/rank_1", "address of attempt 1")
    assert agent_store.get("/worker/attempt_1/default_pg/0//cpu/rank_1") == b"address of attempt 1"
    # The previous attempt's key is not seen: add() creates a key that does not exist
    # (Store.check is not in torch 1.10's Python API).
    assert store.add("default_pg/0//cpu/rank_0", 1) == 1


def test_on_several_nodes_torch_makes_the_store(
    monkeypatch, cpu, events, torch_groups, agent_store
):
    """Each node's agent counts its own restarts: the counts of two nodes can differ."""
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")
    mdist.init_distributed(cpu, "pytorch", timeout=10)
    assert events == [("init_process_group", "gloo", dict(timeout=datetime.timedelta(seconds=10)))]


def test_without_an_agent_store_torch_makes_the_store(monkeypatch, cpu, events, torch_groups):
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "False")  # torch 1.10's --standalone
    mdist.init_distributed(cpu, "pytorch", timeout=10)
    assert events == [("init_process_group", "gloo", dict(timeout=datetime.timedelta(seconds=10)))]


def test_init_distributed_passes_other_dist_cfg_options(monkeypatch, cpu, events, torch_groups):
    monkeypatch.setenv("LOCAL_RANK", "0")
    mdist.init_distributed(cpu, "pytorch", init_method="env://", timeout=60)
    timeout = datetime.timedelta(seconds=60)
    assert events == [("init_process_group", "gloo", dict(init_method="env://", timeout=timeout))]


def test_init_distributed_without_eccl_stops_before_the_group(monkeypatch, events, torch_groups):
    accelerator = fakes.gcu2(monkeypatch, events=events, eccl=False)
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(GCUError, match="ECCL is not available"):
        mdist.init_distributed(accelerator, "pytorch")
    assert events == [("set_device", 0)]


def test_init_distributed_refuses_a_bad_rank_before_any_group(monkeypatch, gcu2, events):
    monkeypatch.setenv("LOCAL_RANK", "8")
    with pytest.raises(GCUError):
        mdist.init_distributed(gcu2, "pytorch")
    assert events == [] and gcu2.card_group is None


def test_init_distributed_refuses_a_bad_backend_before_any_group(monkeypatch, gcu2, events):
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(GCUError, match="'gloo' cannot carry GCU tensors"):
        mdist.init_distributed(gcu2, "pytorch", pg_backend="gloo")
    assert gcu2.card_group is None


def test_slurm_environment(monkeypatch, gcu2, torch_groups):
    monkeypatch.setenv("SLURM_PROCID", "5")
    monkeypatch.setenv("SLURM_NTASKS", "16")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    monkeypatch.setenv("SLURM_NODELIST", "node[1-2]")
    getoutput = mock.Mock(return_value="node1")
    monkeypatch.setattr(compat.subprocess, "getoutput", getoutput)
    assert mdist.init_distributed(gcu2, "slurm", port=29600) == 1
    assert os.environ["RANK"] == "5" and os.environ["WORLD_SIZE"] == "16"
    assert os.environ["LOCAL_RANK"] == "1"
    assert os.environ["MASTER_PORT"] == "29600"
    assert os.environ["MASTER_ADDR"] == "node1"
    getoutput.assert_called_once_with("scontrol show hostname node[1-2] | head -n1")


def test_slurm_keeps_a_given_master(monkeypatch, gcu2, torch_groups):
    for name, value in [("SLURM_PROCID", "0"), ("SLURM_NTASKS", "1"), ("SLURM_LOCALID", "0")]:
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setattr(compat.subprocess, "getoutput", mock.Mock(side_effect=AssertionError))
    mdist.init_distributed(gcu2, "slurm")
    assert os.environ["MASTER_ADDR"] == "10.0.0.1" and os.environ["MASTER_PORT"] == "29500"


def test_mpi_environment(monkeypatch, gcu2, torch_groups):
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "3")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3")
    assert mdist.init_distributed(gcu2, "mpi", port=29700) == 3
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"]) == (
        "3",
        "4",
        "3",
    )
    assert os.environ["MASTER_PORT"] == "29700" and os.environ["MASTER_ADDR"] == "127.0.0.1"


def test_mpi_keeps_a_given_master(monkeypatch, gcu2, torch_groups):
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.2")
    monkeypatch.setenv("MASTER_PORT", "1234")
    mdist.init_distributed(gcu2, "mpi")
    assert os.environ["MASTER_ADDR"] == "10.0.0.2" and os.environ["MASTER_PORT"] == "1234"


@pytest.mark.parametrize("launcher", ["mpi", "slurm"])
def test_init_distributed_outside_the_launcher_is_a_gcu_error(gcu2, torch_groups, launcher):
    with pytest.raises(GCUError, match=f"--launcher {launcher}"):
        mdist.init_distributed(gcu2, launcher)


# -- lost_peer -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "error,expected",
    [
        (RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:24968"), True),
        (RuntimeError("[pair.cc:589] Read error [127.0.0.1]: Connection reset by peer"), True),
        (RuntimeError("[pair.cc:400] Write error: Broken pipe"), True),
        (RuntimeError("injected fault in rank 2"), False),
        (ValueError("Connection closed by peer"), False),  # not from a collective
    ],
)
def test_lost_peer_reads_gloo_errors(error, expected):
    assert mdist.lost_peer(error) is expected


@pytest.mark.skipif(not hasattr(torch_dist, "DistError"), reason="torch < 2.1")
def test_lost_peer_takes_a_backend_error():
    assert mdist.lost_peer(torch_dist.DistBackendError("ECCL watchdog: collective timed out"))

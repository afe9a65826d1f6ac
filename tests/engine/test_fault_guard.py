"""FaultGuard: one message for a fault every rank meets, and a rank that lost a peer waits
so the launcher names the rank that failed first."""

from unittest import mock

import pytest
import torch

import mmgcu.engine.fault_guard as mguard
from mmgcu.device import GCUError
from mmgcu.engine.fault_guard import FaultGuard
from mmgcu.engine.hooks.watchdog import GCUWatchdogHook, NoWatchdog
from tests import fakes

PEER_GONE = RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [::1]:24968")


@pytest.fixture
def sleeps(monkeypatch):
    slept = []
    monkeypatch.setattr(mguard.time, "sleep", slept.append)
    return slept


def guard_of(launcher="pytorch", rank=1, world_size=8, **env_cfg):
    """A started guard of ``rank`` (its locks are tests/runtime/test_locks.py's subject)."""
    guard = FaultGuard(fakes.cpu(), dict(watchdog=False, **env_cfg), launcher != "none")
    with mock.patch.object(mguard, "hold_locks", lambda *args: None):
        guard.start(rank, world_size, "work")
    return guard


def test_the_watchdog_is_built_from_env_cfg_for_several_ranks():
    assert isinstance(FaultGuard(fakes.cpu(), {}, distributed=True).watchdog, GCUWatchdogHook)
    assert isinstance(FaultGuard(fakes.cpu(), {}, distributed=False).watchdog, NoWatchdog)
    off = FaultGuard(fakes.cpu(), dict(watchdog=False), distributed=True)
    assert isinstance(off.watchdog, NoWatchdog)


def test_start_takes_this_ranks_locks(monkeypatch):
    taken = []
    monkeypatch.setattr(mguard, "hold_locks", lambda *args: taken.append(args) or "held")
    accelerator = fakes.cpu()
    guard = FaultGuard(accelerator, {}, distributed=True)

    guard.start(3, 8, "work")

    assert taken == [(accelerator, 3, "work", True)]
    assert (guard.rank, guard.world_size, guard.locks) == (3, 8, "held")


@pytest.mark.parametrize("rank", [0, 1])
def test_a_fault_every_rank_meets_is_said_by_rank_0(rank, sleeps):
    guard = guard_of(rank=rank)
    guard.watchdog = mock.Mock(spec=GCUWatchdogHook)

    with pytest.raises(GCUError) as raised:
        with guard.said_once():
            raise GCUError("iter_4.pth is damaged")

    if rank == 0:
        assert str(raised.value) == "iter_4.pth is damaged" and sleeps == []
        assert not guard.watchdog.stand_down.called
    else:
        assert str(raised.value) == "rank 1 stops: rank 0 says why"
        assert sleeps == [FaultGuard.peer_loss_grace_s]
        guard.watchdog.stand_down.assert_called_once_with()  # waiting is no hang


def test_a_rank_that_lost_a_peer_waits_for_the_launcher(sleeps):
    logger = mock.Mock()

    guard = guard_of()
    guard.watchdog = mock.Mock(spec=GCUWatchdogHook)

    with pytest.raises(RuntimeError) as raised:
        with guard.failed_peer_first(logger):
            raise PEER_GONE

    assert raised.value is PEER_GONE
    assert sleeps == [FaultGuard.peer_loss_grace_s]
    # its watchdog names a peer that hung, then stands down: the wait is no hang
    assert [c[0] for c in guard.watchdog.method_calls] == ["explain", "stand_down"]
    fmt, *args = logger.error.call_args.args
    line = fmt % tuple(args)
    assert line.startswith("rank 1: a collective failed because another rank stopped")
    assert "Connection closed by peer" in line


@pytest.mark.skipif(not hasattr(torch.distributed, "DistBackendError"), reason="torch < 2.1")
def test_a_backend_error_without_a_message_is_reraised(sleeps):
    error = torch.distributed.DistBackendError("")

    with pytest.raises(torch.distributed.DistBackendError) as raised:
        with guard_of().failed_peer_first(mock.Mock()):
            raise error

    assert raised.value is error
    assert sleeps == [FaultGuard.peer_loss_grace_s]


@pytest.mark.parametrize(
    "error,launcher",
    [(RuntimeError("injected fault"), "pytorch"), (PEER_GONE, "none")],
    ids=["own-error", "single-process"],
)
def test_a_rank_that_failed_itself_exits_at_once(error, launcher, sleeps):
    logger = mock.Mock()

    with pytest.raises(RuntimeError) as raised:
        with guard_of(launcher).failed_peer_first(logger):
            raise error

    assert raised.value is error
    assert sleeps == []
    logger.error.assert_not_called()

"""The watchdog's configuration, and the one-message stop of every rank."""

import time
from types import SimpleNamespace

import pytest

from mmgcu.device import GCUError
from mmgcu.errors import stop_every_rank
from mmgcu.watchdog import GCUWatchdogHook, NoWatchdog, build_watchdog


def runner(distributed=True, **env_cfg):
    return SimpleNamespace(distributed=distributed, cfg=dict(env_cfg=env_cfg))


def test_one_process_or_false_has_no_watchdog():
    assert isinstance(build_watchdog(runner(distributed=False)), NoWatchdog)
    assert isinstance(build_watchdog(runner(watchdog=False)), NoWatchdog)
    with NoWatchdog().saving():
        pass


def test_defaults_half_nccls_ten_minutes_and_thirty_for_slow_phases():
    dog = build_watchdog(runner())
    assert isinstance(dog, GCUWatchdogHook)
    assert (dog.timeout, dog.slow_timeout, dog.interval) == (300.0, 1800.0, 2.0)


def test_the_collective_timeout_is_the_default_bound():
    dog = build_watchdog(runner(dist_cfg=dict(timeout=60)))
    assert (dog.timeout, dog.slow_timeout) == (60.0, 1800.0)
    dog = build_watchdog(runner(dist_cfg=dict(timeout=60), watchdog=dict(timeout=20)))
    assert dog.timeout == 20.0


def test_an_unknown_key_is_refused():
    with pytest.raises(GCUError, match=r"unknown key\(s\) \['timout'\]"):
        build_watchdog(runner(watchdog=dict(timout=5)))


def test_rank_0_reports_and_the_others_wait_for_the_launcher():
    with pytest.raises(GCUError, match="^the checkpoint is damaged$"):
        stop_every_rank("the checkpoint is damaged", rank=0, world_size=8, grace_s=5)
    started = time.time()
    with pytest.raises(GCUError, match="^rank 3 stops: rank 0 says why$"):
        stop_every_rank("the checkpoint is damaged", rank=3, world_size=8, grace_s=0.2)
    assert time.time() - started >= 0.2

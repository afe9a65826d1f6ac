"""The host heap on simulated cards keeps what it frees, as a card's memory does."""

import os

import pytest

from mmgcu.sim import heap
from tests.conftest import last_json
from tests.sim.helpers import program, run_program

PAGES = (64 << 20) // 4096  # the faults of touching a fresh 64 MB block once


@pytest.fixture
def rounds(monkeypatch):
    """``rounds(**env)``: what six 64 MB blocks did, in a process without this session's
    own heap settings."""
    for name in [n for n in os.environ if n.startswith("MALLOC_")] + ["GLIBC_TUNABLES"]:
        monkeypatch.delenv(name, raising=False)
    return lambda **env: last_json(run_program(program("heap_faults"), **env).stdout)


def test_a_simulated_process_reuses_freed_blocks(rounds):
    seen = rounds(MMGCU_SIMULATE=2)
    assert seen["mapped"] == [0] * 6, seen  # every block from the heap
    assert max(seen["faults"][3:]) < PAGES // 10, seen  # and its pages kept


def test_without_the_simulator_glibc_keeps_its_defaults(rounds):
    # glibc maps a block this large on its own and unmaps it when freed.
    assert rounds()["mapped"] == [1] * 6


@pytest.mark.parametrize(
    "setting",
    [{"MALLOC_MMAP_MAX_": "65536"}, {"GLIBC_TUNABLES": "glibc.malloc.mmap_max=65536"}],
    ids=["variable", "tunable"],
)
def test_a_setting_the_user_made_wins(rounds, setting):
    assert rounds(MMGCU_SIMULATE=2, **setting)["mapped"] == [1] * 6


def test_the_users_settings_are_read_from_both_places():
    env = {"MALLOC_ARENA_MAX": "4", "GLIBC_TUNABLES": "glibc.rtld.x=1:glibc.malloc.tcache_count=0"}
    assert heap.users_settings(env) == ["MALLOC_ARENA_MAX", "glibc.malloc.tcache_count"]
    assert heap.users_settings({"GLIBC_TUNABLES": "glibc.rtld.nns=2"}) == []

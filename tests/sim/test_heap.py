"""The host heap on simulated cards keeps what it frees, as a card's memory does."""

import pytest

from mmgcu.sim import heap
from tests.conftest import last_json
from tests.sim.helpers import program, run_program

PAGES = (64 << 20) // 4096  # the faults of touching a fresh 64 MB block once


def faults(**env):
    """Page faults of the last three of six 64 MB allocations (steady state)."""
    return last_json(run_program(program("heap_faults"), **env).stdout)[3:]


def test_a_simulated_process_reuses_freed_blocks():
    assert max(faults(MMGCU_SIMULATE=2)) < PAGES // 10


def test_without_the_simulator_glibc_keeps_its_defaults():
    # glibc maps a block this large on its own and unmaps it when freed: fresh pages each time.
    assert min(faults()) >= PAGES


@pytest.mark.parametrize(
    "setting",
    [
        {"MALLOC_MMAP_MAX_": "65536"},
        {"GLIBC_TUNABLES": "glibc.malloc.mmap_max=65536"},
    ],
)
def test_a_setting_the_user_made_wins(setting):
    assert min(faults(MMGCU_SIMULATE=2, **setting)) >= PAGES


def test_the_users_settings_are_read_from_both_places():
    env = {"MALLOC_ARENA_MAX": "4", "GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"}
    assert heap.users_settings(env) == ["MALLOC_ARENA_MAX", "MALLOC_TRIM_THRESHOLD_"]
    assert heap.users_settings({}) == []

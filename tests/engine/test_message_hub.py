"""CardMessageHub: card scalars reach the hub in one read per log line, with stock values."""

import os.path as osp

import pytest

from tests.conftest import REPO, last_json, one_worker, run_program

# The module-scoped runs are made once: the module runs on one xdist worker.
pytestmark = one_worker(__name__)

PROGRAM = osp.join(REPO, "tests", "engine", "programs", "message_hub_log.py")


@pytest.fixture(scope="module")
def logged():
    """20 steps logged every 10, through a CardMessageHub and through a stock MessageHub."""
    return last_json(run_program(PROGRAM, 20, 10, MMGCU_SIMULATE=1).stdout)


def test_the_log_sees_stock_values_in_stock_order(logged):
    # Every log line, every history (values and counts) and the order of keys.
    assert logged["card_logged"] == logged["stock_logged"]
    assert logged["card_scalars"] == logged["stock_scalars"]
    assert list(logged["card_scalars"]) == list(logged["stock_scalars"])
    assert len(logged["card_logged"]) == 2 and "train/decode.acc_seg" in logged["card_logged"][0]


def test_the_card_is_read_once_per_log_line(logged):
    # Stock: one read per card scalar per step (3 x 20). The card hub: the first step (its
    # new keys take their place in the log's order), then one read per log line; the
    # host values (lr, times) and IterTimerHook's read of its own time read nothing.
    assert logged["stock_reads"] == 60
    assert logged["card_reads"] == 3


@pytest.fixture(scope="module")
def on_a_lazy_card():
    """The same on one simulated T20 card, with a third hub sealed at each iteration's end."""
    return last_json(run_program(PROGRAM, 20, 10, MMGCU_SIMULATE="t20:1").stdout)


def test_on_a_lazy_card_an_unsealed_read_runs_the_graph_of_the_scalars(on_a_lazy_card):
    """Values no graph output yet: each log line's read runs a graph of them (on a T20 it
    would compute the steps again)."""
    assert on_a_lazy_card["card_graphs"] == 2
    assert on_a_lazy_card["card_reads"] == 3  # and the first step's new keys, read at once


def test_sealed_scalars_are_read_without_a_graph(on_a_lazy_card):
    """Each iteration's scalars stacked and output by the iteration's graph: the log reads
    them with transfers alone (one per iteration's stack), the same values as stock's."""
    assert on_a_lazy_card["sealed_graphs"] == 0
    assert on_a_lazy_card["sealed_reads"] == 20
    assert on_a_lazy_card["sealed_logged"] == on_a_lazy_card["stock_logged"]
    assert on_a_lazy_card["sealed_scalars"] == on_a_lazy_card["stock_scalars"]

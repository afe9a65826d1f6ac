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

"""The simulated ECCL across two real processes: collectives on card tensors, and DDP in sync."""

import pytest

from tests.conftest import SIM_APIS, needs_torch2
from tests.sim.helpers import DEVICE_TYPE, run_ranks


@pytest.mark.parametrize("api", SIM_APIS)
def test_collectives_and_ddp(api):
    outs = run_ranks("eccl_worker", MMGCU_SIMULATE=2, MMGCU_SIMULATE_API=api)
    kind = DEVICE_TYPE[api]
    for rank, out in enumerate(outs):
        card = f"{kind}:{rank}"
        assert out["card_sum"] == [card, [3.0] * 4], rank  # 1 + 2, in place, on the card
        assert out["view_sum"] == [0.0, 0.0, 3.0, 3.0, 3.0, 3.0, 0.0, 0.0], rank
        assert out["big_sum"] == [3.0, 3.0], rank
        assert out["max"] == [1.0, 5.0], rank
        assert out["int_sum"] == ["torch.int32", [3, 3, 3]], rank
        assert out["half_sum"] == ["torch.float16", [1.5, 1.5, 1.5]], rank
        assert out["cpu_sum"] == ["cpu", 12.0], rank
        assert out["devices"] == [card], rank
        assert out["ref_diff"] < 1e-5, rank
        if api == "gcu2":
            assert out["backend"] == "cpu:gloo,gcu:eccl"
        else:
            assert out["backend"] == "eccl"
            assert out["eccl_world"] is True
            assert "ECCL carries only GCU tensors" in out["cpu_on_eccl"]
            assert "Pass device_ids=[this rank's card]" in out["every_card"]
    assert outs[0]["start"] != outs[1]["start"]  # the ranks started apart ...
    assert outs[0]["checksum"] == outs[1]["checksum"]  # ... and ended identical


@pytest.mark.parametrize("api", SIM_APIS)
def test_bare_eccl_refuses_cpu_tensors(api):
    outs = run_ranks("bare_eccl", MMGCU_SIMULATE=2, MMGCU_SIMULATE_API=api)
    for rank, out in enumerate(outs):
        assert out["backend"] == "eccl"
        assert out["card_sum"] == [f"{DEVICE_TYPE[api]}:{rank}", 9.0]
        assert out["cpu"] is not None and "ECCL carries only GCU tensors" in out["cpu"]


@needs_torch2
def test_exit_without_destroying_the_group_is_clean():
    """The fake ECCL releases its gloo at exit: without that, ~1 process in 4 aborts here."""
    for _ in range(6):  # each rank exits non-zero (SIGABRT) if teardown aborts
        results = run_ranks("exit_without_destroy", world_size=2, MMGCU_SIMULATE=2)
        assert [r["sum"] for r in results] == [[2.0, 2.0, 2.0]] * 2

"""The simulated torch_gcu 1.x conforms to the public 1.x source, fact by fact.

Each fact (``tests/sim/programs/torch_gcu1_facts.py``) names the file of the 1.x source it
comes from. The one-process facts run in one interpreter, the distributed ones under
torchrun with two ranks on two simulated cards.
"""

import subprocess
import sys

import pytest

from mmgcu.runtime.dist import lost_peer
from tests.conftest import REPO, clean_env, last_json, one_worker
from tests.sim.helpers import run_ranks
from tests.sim.programs import torch_gcu1_facts

# The module-scoped runs are made once: the module runs on one xdist worker.
pytestmark = one_worker(__name__)

PROGRAM = torch_gcu1_facts.__file__


def _run(ranks: int) -> dict:
    cmd = [sys.executable, PROGRAM]
    if ranks > 1:
        # Plain --standalone, as a T20 user may start torchrun: on torch 1.10 its c10d
        # rendezvous leaves torchrun's agent store unused (TORCHELASTIC_USE_AGENT_STORE=
        # False), the ECCL rendezvous the other tests' static one does not take. The
        # only test that holds localhost:29400 there, so xdist's workers never meet on it.
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        cmd += [f"--nproc_per_node={ranks}", PROGRAM]
    env = clean_env(MMGCU_SIMULATE=2, MMGCU_SIMULATE_API="gcu1", OMP_NUM_THREADS=1)
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return last_json(proc.stdout)


@pytest.fixture(scope="module")
def results():
    return {1: _run(1), 2: _run(2)}


@pytest.mark.parametrize(
    "name,source,says,ranks",
    [(name, source, says, ranks) for name, source, says, _, ranks in torch_gcu1_facts.FACTS],
    ids=[f"{source}::{name}" for name, source, _, _, _ in torch_gcu1_facts.FACTS],
)
def test_fact(results, name, source, says, ranks):
    outcome = results[ranks][name]
    if outcome.startswith("skip: "):
        pytest.skip(outcome[len("skip: ") :])
    assert outcome == "", f"torch_gcu/{source}: {says}\n{outcome}"


def test_a_lost_peer_in_the_ddp_backward_reaches_the_caller():
    """nn/parallel/distributed.py: the DDP's Reducer is C++, so an ECCL error in the gradient
    reduction of a backward pass reaches ``backward()``'s caller whole. Before, torch 1.10
    lost the simulated reducer's Python error on the card's autograd thread: "SystemError:
    <built-in method run_backward ...> returned NULL without setting an error"."""
    outs = run_ranks("ddp_lost_peer", MMGCU_SIMULATE=2, MMGCU_SIMULATE_API="gcu1")
    assert outs[1] == {"rank": 1, "stopped": True}
    kind, message = outs[0]["error"]
    assert kind == "RuntimeError", (kind, message)
    assert lost_peer(RuntimeError(message)), message  # what GCURunner recognises and names


def test_gloo_refuses_a_card_tensor_on_both_torch_generations():
    """torch_gcu 1.x's torch.distributed has only gloo, which refuses a card tensor
    (torch 1.10: "ProcessGroupGloo::allreduce: unsupported device type xla"). torch 2
    dispatches c10d ops by device, so the simulator refuses them itself instead of running
    gloo's CPU kernel on the card's memory (a rehearsal of Mask2Former passed there)."""
    outs = run_ranks("gloo_card_tensor", MMGCU_SIMULATE=2, MMGCU_SIMULATE_API="gcu1")
    for rank, out in enumerate(outs):
        assert out["card"] == "ProcessGroupGloo::allreduce: unsupported device type xla", out
        assert out["cpu"] == [2.0] and out["rank"] == rank

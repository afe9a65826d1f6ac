"""Shared helpers: the simulator installs once per process, so most tests run a fresh one."""

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# make test runs three pytest-xdist workers on two cores: one intra-op thread in each test
# process and each process it starts (a second one mostly spins there). torchrun's ranks
# get one from the launch helpers already, as torchrun itself gives them.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

#: torch_gcu 2.x exists only for torch 2.x: on the T20 stack's leg (torch 1.10) the
#: simulator models torch_gcu 1.x alone, and what needs 2.x skips, saying so.
TORCH_1 = torch.__version__.startswith("1.")
needs_torch2 = pytest.mark.skipif(
    TORCH_1, reason="torch_gcu 2.x exists only for torch 2.x (this leg runs torch 1.10)"
)
#: The simulated generations, as pytest parameters (2.x skipped on torch 1.x).
SIM_APIS = [pytest.param("gcu2", marks=needs_torch2), "gcu1"]

#: What the launchers (torchrun, srun, mpirun) and the card selection read from os.environ.
LAUNCHER_VARS = (
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "SLURM_LOCALID",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_NODELIST",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "RANK",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TOPS_VISIBLE_DEVICES",
    "ENFLAME_VISIBLE_DEVICES",
)


#: The card locks of the jobs this test session starts: a folder of its own, so that test
#: sessions (and real jobs) on one machine do not refuse each other's simulated cards.
LOCK_DIR = tempfile.mkdtemp(prefix="mmgcu-test-locks-")
atexit.register(shutil.rmtree, LOCK_DIR, ignore_errors=True)


def running(pid):
    """Whether ``pid`` runs (a zombie waiting for its reaper does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def clean_env(**extra):
    """This environment without simulator/launcher variables, plus ``extra`` (and the
    session's card-lock folder)."""
    prefixes = ("MMGCU_", "TOPS_", "ENFLAME_", "LOCAL_", "RANK", "WORLD_", "MASTER_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env["MMGCU_LOCK_DIR"] = LOCK_DIR
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _run(argv, timeout, check, env):
    """``python ARGV`` in a fresh interpreter from the checkout, ``env`` added."""
    proc = subprocess.run(
        [sys.executable, *argv],
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def run_python(code, timeout=300, check=True, **env):
    """Run ``code`` in a fresh interpreter with ``env`` added; return the CompletedProcess."""
    return _run(["-c", textwrap.dedent(code)], timeout, check, env)


def run_program(path, *args, timeout=300, check=True, **env):
    """Run the program file ``path`` with ``args`` in a fresh interpreter, ``env`` added.

    Programs live next to their tests (``tests/<dir>/programs/<name>.py``); they print
    what they found as a JSON line (read it with :func:`last_json`).
    """
    return _run([str(path), *[str(a) for a in args]], timeout, check, env)


def free_port() -> int:
    """A TCP port free on this host now (for MASTER_PORT), as mmgcu's launcher picks one."""
    from mmgcu.launch.ports import free_port as mmgcus

    return mmgcus()


def one_node() -> list:
    """torchrun's flags for a one-node job with a rendezvous of its own, as ``mmgcu train``
    gives one (:func:`mmgcu.launch.torchrun.torchrun_flags`): torch 1.10's ``--standalone`` is
    always localhost:29400, where jobs that run side by side (pytest-xdist's workers) would
    meet."""
    from mmgcu.launch.torchrun import torchrun_flags

    return torchrun_flags({}, torch.__version__)


def last_json(stdout):
    """The last line of ``stdout`` that is a JSON document (what a snippet printed)."""
    for line in reversed(stdout.strip().splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    raise AssertionError(f"no JSON line in:\n{stdout}")


def one_worker(name: str):
    """The tests marked with one ``name`` run on one pytest-xdist worker (``make test`` runs
    ``--dist loadgroup``), so a run they share through a module- or session-scoped fixture
    is made once, not once per worker that draws one of them."""
    return pytest.mark.xdist_group(name)


def pytest_collection_modifyitems(items):
    """The longest tests (marked long) first, each followed by a shorter multi-process test
    of no group, then the other multi-process tests (marked e2e), then the rest: under
    pytest-xdist the long runs start early and the short tests fill the cores around them,
    instead of one long run ending the session alone. pytest-xdist's loadgroup hands out
    the groups of several tests first, then single tests two at a time to a worker that
    asks: a short test between two long ones keeps them off one worker. The order is the
    same in every worker, as xdist requires."""
    long_tests = [item for item in items if item.get_closest_marker("long")]
    e2e = [item for item in items if item.get_closest_marker("e2e") and item not in long_tests]
    rest = [item for item in items if item not in long_tests and item not in e2e]
    fillers = [item for item in e2e if item.get_closest_marker("xdist_group") is None]
    ordered = []
    for item in long_tests:
        ordered.append(item)
        if fillers:
            filler = fillers.pop(0)
            e2e.remove(filler)
            ordered.append(filler)
    items[:] = ordered + e2e + rest


@pytest.fixture(scope="session")
def dataset(tmp_path_factory):
    """The synthetic dataset, written once per session (per xdist worker) by the project's
    own tool."""
    root = str(tmp_path_factory.mktemp("data") / "synthetic")
    tool = os.path.join(REPO, "tools", "make_synthetic_dataset.py")
    subprocess.run([sys.executable, tool, root], check=True, capture_output=True)
    return root


#: ``make demo``'s config: the tiny FCN learning the synthetic dataset in 40 iterations.
DEMO = os.path.join(REPO, "configs", "tiny", "fcn_r18-tiny-d8_8xgcu-40it_synthetic-64x64.py")


@pytest.fixture(scope="session")
def eight_card_run(dataset, tmp_path_factory):
    """``tools/dist_train.sh CFG`` without CARDS on a T20 of 8 simulated cards (torch_gcu
    1.x, ``MMGCU_SIMULATE=t20``): the script counts the cards and starts stock
    ``tools/train.py`` under torchrun on all 8, with the probe hook. On the main leg it is
    ``make demo``'s run (the demo config, 40 iterations), which the demo's test asserts on
    too; the T20 leg, which leaves the demo's test out, trains the tiny config 4 iterations.
    Both validate and save. One run for the tests of the script, of training on 8 cards and
    of the demo; they are ``one_worker("eight_card_run")``. torch_gcu 2.x trains on 2 cards
    and on two nodes of two elsewhere."""
    from tests.e2e.conftest import TINY, write_config
    from tests.tools.conftest import run_script

    tmp = tmp_path_factory.mktemp("eight_cards")
    iters = 4 if TORCH_1 else 40
    cfg = write_config(tmp / "cfg.py", dataset, base=TINY if TORCH_1 else DEMO)
    work = str(tmp / "work")
    code, out = run_script(
        "dist_train.sh", cfg, "--work-dir", work, cwd=tmp, timeout=900, MMGCU_SIMULATE="t20"
    )
    return dict(work=work, code=code, out=out, api="gcu1", iters=iters)


@pytest.fixture
def python():
    return run_python


@pytest.fixture
def runner_case():
    """mmengine's own ``RunnerTestCase``, set up: its toy model, dataset and metric are
    registered and ``iter_based_cfg`` / ``epoch_based_cfg`` build real runners, as
    mmengine's tests build them (``build_runner``: mmengine's ``Runner.from_cfg``)."""
    from mmengine.testing import RunnerTestCase

    case = RunnerTestCase()
    case.setUp()
    yield case
    case.tearDown()


@pytest.fixture
def no_launcher_env():
    """os.environ without the launchers' variables, all of it restored afterwards (the
    slurm/mpi set-up and init_distributed write os.environ themselves)."""
    saved = dict(os.environ)
    for name in LAUNCHER_VARS:
        os.environ.pop(name, None)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def fsynced(monkeypatch):
    """The paths os.fsync was called on (through /proc/self/fd), in order."""
    paths, real = [], os.fsync

    def record(fd):
        paths.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", record)
    return paths


@pytest.fixture
def fresh_notes(monkeypatch):
    """mmgcu's once-per-process notes (mmgcu.binding) start unsaid."""
    import mmgcu.binding

    monkeypatch.setattr(mmgcu.binding, "_said", set())


def run_log(runner) -> str:
    """What ``runner`` has logged so far (its log file)."""
    path = os.path.join(runner.log_dir, f"{runner.timestamp}.log")
    with open(path) as f:
        return f.read()

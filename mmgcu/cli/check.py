"""``mmgcu check``: prove that every card of this node trains, before a long job finds out.

It starts one process per card with torch's own launcher (``torch.distributed.run``), as a
training job does. Each worker (:mod:`mmgcu.cli.check_worker`) takes its card and process
group from mmgcu, checks collectives on card tensors and CPU objects, trains a few DDP
steps, and rank 0 compares the weights with the same steps on one card. Workers write
their progress and result as JSON files to a temp folder; this process reads them (never
the logs) and prints one line: OK, or the first failure with its fix. Exit status 0 or 1.
"""

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import List, Optional

from .. import sim
from ..launch import torchrun as launcher
from . import check_worker as worker

PREFIX = "mmgcu check: "
_EXCEPTION = re.compile(r"^[\w.]*(?:Error|Exception|Interrupt): .*$", re.M)
# torchrun's summary when a worker fails: the rank and exit code it saw fail first.
_ROOT_CAUSE = re.compile(r"Root Cause.*?\brank\s*:\s*(\d+).*?\bexitcode\s*:\s*(-?\d+)", re.S)
#: Grace for torchrun to stop its workers after SIGTERM, before SIGKILL.
KILL_GRACE_S = 10.0


def add_parser(sub) -> None:
    from ..device import ALIASES, DEVICES

    parser = sub.add_parser(
        "check",
        help="launch one process per card and prove collectives and DDP training",
        description="Launch one process per card with torchrun; check collectives on the "
        "cards and that DDP training matches one card. Prints one line: OK or the failure.",
    )
    parser.add_argument(
        "--cards",
        type=int,
        default=None,
        help="ranks to launch, one per card (default: all cards of this node)",
    )
    parser.add_argument("--steps", type=int, default=3, help="DDP steps to compare (default 3)")
    parser.add_argument(
        "--device",
        choices=DEVICES + tuple(ALIASES),
        default="auto",
        help="the device generation, as env_cfg.device (default: auto-detect)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="seconds for the whole run; then its processes are killed (default 300)",
    )
    parser.set_defaults(func=run)


class CheckError(Exception):
    """Why the check failed, as the one line to print."""


NO_CARD_FIX = (
    "On a GCU host, check the driver with efsmi (and TOPS_VISIBLE_DEVICES); on a machine "
    "without one, rehearse on simulated T20 cards: MMGCU_SIMULATE=t20 mmgcu check"
)


def ranks_to_launch(cards: Optional[int]) -> int:
    """``--cards``, or every card of the node; refuse more ranks than cards up front, and
    any number of ranks where no torch_gcu could give them a card."""
    from ..device import count_cards

    try:
        count, source = count_cards()
    except ValueError as e:  # an MMGCU_SIMULATE that names no hardware
        raise CheckError(str(e)) from None
    if cards is None:
        if count < 1:
            raise CheckError(f"no GCU card found ({source}). {NO_CARD_FIX}.")
        return count
    if cards < 1:
        raise CheckError(f"--cards {cards}: launch at least one rank")
    if not count and importlib.util.find_spec("torch_gcu") is None:
        raise CheckError(
            f"--cards {cards}, but this machine has no torch_gcu and no GCU card ({source}). "
            f"{NO_CARD_FIX} --cards {cards}."
        )
    if count and cards > count:
        raise CheckError(
            f"--cards {cards} but this node has {count} card(s) ({source}): use "
            f"--cards {count} or fewer, or make more cards visible with TOPS_VISIBLE_DEVICES."
        )
    return cards


def run(args) -> int:
    """``mmgcu check``: one line on stdout and status 0, or one FAILED line and status 1."""
    started = time.time()
    try:
        nproc = ranks_to_launch(args.cards)
        if args.steps < 1:
            raise CheckError(f"--steps {args.steps}: train at least one step")
    except CheckError as e:
        print(f"{PREFIX}FAILED: {e}", file=sys.stderr)
        return 1
    out = tempfile.mkdtemp(prefix="mmgcu-check-")
    try:
        line = PREFIX + "OK: " + launch(args, nproc, out, started)
    except CheckError as e:
        print(f"{PREFIX}FAILED: {e} (logs: {out})", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # the run was stopped by launch(); keep its logs
        print(f"{PREFIX}FAILED: interrupted (logs: {out})", file=sys.stderr)
        return 130
    shutil.rmtree(out, ignore_errors=True)
    print(line)
    return 0


def command(args, nproc: int, out: str, torch: Optional[str]) -> List[str]:
    """torchrun's command line for ``nproc`` workers writing to ``out``, for the torch
    version ``torch``. A rendezvous of the check's own
    (:func:`mmgcu.launch.torchrun.torchrun_flags`): torch 1.x's ``--standalone`` is always
    localhost:29400, where a second check or a job on the node would meet this one."""
    cmd = [sys.executable, "-m", "torch.distributed.run", *launcher.torchrun_flags({}, torch)]
    cmd += [f"--nproc_per_node={nproc}", "-m", worker.__name__, "--out", out]
    cmd += ["--steps", str(args.steps), "--device", args.device, "--timeout", str(args.timeout)]
    return cmd


def launch(args, nproc: int, out: str, started: float) -> str:
    """Run the workers under torchrun and return the success summary, or raise CheckError."""
    cmd = command(args, nproc, out, launcher.torch_version())
    env = sim.child_env(os.environ)  # the workers do not repeat this process's notice
    env.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default, without its warning
    log_path = os.path.join(out, "launcher.log")
    with open(log_path, "w") as log:
        # A session of its own, so a timeout can stop torchrun and nothing else.
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        timed_out = False
        try:
            proc.wait(timeout=max(1.0, args.timeout - (time.time() - started)))
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _stop(proc, out)
    results = worker.read_results(out)
    took = time.time() - started
    return judge(results, nproc, proc.returncode, timed_out, args, took, log_path)


def judge(results, nproc, code: Optional[int], timed_out: bool, args, took: float, log: str) -> str:
    """The success summary from the workers' results, or the CheckError that explains why not."""
    failed = [r for r in results.values() if r.get("ok") is False]
    if failed:
        # A wrong value or a set-up error is the cause; crashes of the others follow from it.
        first = min(failed, key=lambda r: (r.get("kind") == "crash", r.get("time", 0)))
        raise CheckError(f"rank {first['rank']} ({first.get('phase')}): {first.get('error')}")
    if timed_out:
        raise CheckError(f"timed out after {args.timeout:g} s: {_laggards(results, nproc)}")
    missing = [r for r in range(nproc) if results.get(r, {}).get("ok") is not True]
    if code != 0 or missing:
        raise CheckError(
            f"torchrun exited with status {code} before every rank finished: "
            f"{_laggards(results, nproc)}{_last_error(log)}"
        )
    rank0 = results[0]
    cards = len({r.get("device") for r in results.values()})
    kind = "GCU card" if rank0.get("is_gcu") else f"{rank0.get('device_type')} device"
    sim = "simulated " if rank0.get("simulated") else ""
    return (
        f"{nproc} rank{'s' * (nproc > 1)} on {cards} {sim}{kind}{'s' * (cards > 1)} "
        f"({rank0.get('generation')}, {rank0.get('dist_backend')}); collectives and "
        f"{args.steps} DDP step{'s' * (args.steps > 1)} match one card "
        f"(max diff {rank0.get('max_diff', float('nan')):.1e}) in {took:.1f} s"
    )


def _laggards(results, nproc: int) -> str:
    """Which ranks did not answer: those that never reported, or reached the fewest phases."""
    from ..device import physical_card

    phases = worker.PHASES
    reached = {r: phases.index(results[r]["phase"]) if r in results else -1 for r in range(nproc)}
    furthest = max(reached.values())
    if furthest < 0:
        return f"none of the {nproc} ranks reported, so the workers did not start"
    behind = [r for r in range(nproc) if reached[r] < furthest]
    if not behind:
        return (
            f"all {nproc} ranks stopped in '{phases[furthest]}', so a collective never "
            "completed: check ECCL with 'mmgcu env' and the cards with efsmi"
        )
    where = [
        f"rank {r} (card {physical_card(r)}) "
        + ("never reported" if reached[r] < 0 else f"stopped in '{phases[reached[r]]}'")
        for r in behind
    ]
    ahead = _ids([r for r in range(nproc) if reached[r] == furthest])
    return (
        f"{'; '.join(where)}, while rank(s) {ahead} reached '{phases[furthest]}'. Check "
        "that card with efsmi, or raise --timeout if the machine is only slow"
    )


def _last_error(log: str) -> str:
    """For ranks that died before writing a result: torchrun's root cause and the last error."""
    with open(log, errors="replace") as f:
        text = f.read()
    said = []
    root = _ROOT_CAUSE.search(text)
    if root:
        said.append(f"torchrun saw rank {root.group(1)} fail first (exit code {root.group(2)})")
    errors = [m.strip() for m in _EXCEPTION.findall(text) if "ChildFailedError" not in m]
    if errors:
        said.append(f"last error in the log: {errors[-1]}")
    return "".join(f"; {x}" for x in said)


def _ids(ranks: List[int]) -> str:
    return ",".join(str(r) for r in ranks)


def _stop(proc: subprocess.Popen, out: str) -> None:
    """Stop torchrun, then any worker it left behind (only pids our workers reported)."""
    if proc.poll() is None:
        _signal_group(proc.pid, signal.SIGTERM)  # torchrun passes it on to its workers
        try:
            proc.wait(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
    for result in worker.read_results(out).values():
        pid = result.get("pid")
        if pid and _is_our_worker(pid):
            _signal(os.kill, pid, signal.SIGKILL)


def _signal_group(pid: int, sig: int) -> None:
    _signal(os.killpg, pid, sig)


def _signal(kill, pid: int, sig: int) -> None:
    try:
        kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _is_our_worker(pid: int) -> bool:
    """Whether ``pid`` still runs a check worker (guards against a reused pid)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return worker.__name__.encode() in f.read()
    except OSError:
        return False

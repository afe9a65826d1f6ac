"""The rehearsal's jobs: stock train.py under torchrun on simulated cards, in a work dir of
the rehearsal's own.

Two jobs, each the training script (mmseg's ``tools/train.py``, or ``TRAIN_SCRIPT``) under
torchrun with ``--launcher pytorch`` (what ``mmgcu train`` runs), with
``MMGCU_SIMULATE=<hardware>:<cards>``: the first builds, places, wraps, trains ``iters``
iterations, validates and saves; the second resumes from that checkpoint and trains one
more iteration, without a save of its own (the first job's save proved the path; a second
would write every weight and optimizer state again, most of a ViT's resume). Nothing in
the runner knows it is a rehearsal. Each job runs on this node alone, with a rendezvous of
its own, whatever the shell says of a job of several nodes.
"""

import os
import os.path as osp
import shutil
import subprocess
import sys
import time
from typing import Callable, Dict, List, Mapping, Optional

from ..launch import torchrun
from ..launch.cards import SIMULATE_ENV
from ..runtime.locks import LOCK_DIR_ENV
from .errors import RehearsalError
from .hook import SEED_EACH_STEP_ENV

#: The file that marks a rehearsal's work dir (its report), which a later rehearsal clears.
MARK = "rehearsal.json"
#: Simulator settings of the shell that the jobs do not take: each job's cards are the
#: hardware's, and each job's log says that its cards are simulated.
SIMULATOR_VARS = ("MMGCU_SIMULATE_API", "MMGCU_SIMULATE_NOTICE", SEED_EACH_STEP_ENV)


def prepare_work_dir(work_dir: str, config: str) -> None:
    """An empty work dir: an earlier rehearsal's (it holds :data:`MARK`) is cleared, a
    folder that holds anything else is refused, and so is one that holds the config."""
    if osp.abspath(config).startswith(osp.join(osp.abspath(work_dir), "")):
        raise RehearsalError(
            f"the config {config} is inside the work dir {work_dir}, which the "
            "rehearsal clears: give --work-dir another folder"
        )
    if osp.isdir(work_dir) and os.listdir(work_dir):
        if not osp.isfile(osp.join(work_dir, MARK)):
            raise RehearsalError(
                f"{work_dir} is not empty and holds no earlier rehearsal: give "
                "--work-dir a new folder (the rehearsal replaces what it finds there)"
            )
        shutil.rmtree(work_dir)
    os.makedirs(work_dir, exist_ok=True)


def job_env(
    shell: Mapping[str, str], hardware: str, cards: int, work_dir: str, heap: Dict[str, str]
) -> Dict[str, str]:
    """The environment of a job's torchrun: the ``shell``'s for a job of this node alone
    (:func:`mmgcu.launch.torchrun.alone`), with ``cards`` simulated cards of ``hardware``,
    card locks of the rehearsal's own, and the ranks' glibc heap setting ``heap``
    (:func:`mmgcu.rehearsal.host.heap_env`)."""
    env = torchrun.alone(dict(shell))
    for name in SIMULATOR_VARS:
        env.pop(name, None)
    env.update(heap)
    env[SIMULATE_ENV] = f"{hardware}:{cards}"
    # Simulated cards are this rehearsal's own: their locks too (a real job's card locks,
    # or another rehearsal's, are no business of theirs).
    env[LOCK_DIR_ENV] = osp.join(work_dir, "card-locks")
    return env


def resume_options(checkpoint: str, iters: int) -> List[str]:
    """train.py's options for the resume job: from ``checkpoint`` (iteration ``iters``),
    one more iteration, no validation and no save (at the end, ``save_last``, nor on the
    interval: iteration ``iters + 1`` is not a multiple of ``iters + 2``)."""
    return [
        "--resume",
        "--cfg-options",
        f"load_from={checkpoint}",
        f"train_cfg.max_iters={iters + 1}",
        f"train_cfg.val_begin={iters + 2}",
        "default_hooks.checkpoint.save_last=False",
        f"default_hooks.checkpoint.interval={iters + 2}",
    ]


def last_checkpoint(work_dir: str) -> Optional[str]:
    """The checkpoint the job saved last (mmengine's ``last_checkpoint`` file names it)."""
    try:
        with open(osp.join(work_dir, "last_checkpoint")) as f:
            return f.read().strip() or None
    except OSError:
        return None


class Jobs:
    """The rehearsal's jobs in ``work_dir``, each on ``cards`` ranks with the environment
    ``env`` (:func:`job_env`) running ``script``: their logs, exit statuses and seconds."""

    def __init__(self, work_dir: str, cards: int, env: Dict[str, str], script: List[str]):
        self.work_dir, self.cards, self.env, self.script = work_dir, cards, env, script
        self.logs = [osp.join(work_dir, "train.log"), osp.join(work_dir, "resume.log")]
        self.codes: List[int] = []
        self.seconds: Dict[str, float] = {}

    def command(self, config: str, options: List[str]) -> List[str]:
        """The torchrun command of a job of ``config`` with train.py ``options``."""
        command = [sys.executable, "-m", "torch.distributed.run"]
        command += torchrun.torchrun_flags(self.env, torchrun.torch_version())
        command += [f"--nproc_per_node={self.cards}", *self.script, config]
        return command + ["--work-dir", self.work_dir, "--launcher", "pytorch", *options]

    def run(self, name: str, config: str, options: List[str]) -> int:
        """Run the next job (``name``: 'train', 'resume'), its output in its log."""
        start = time.time()
        with open(self.logs[len(self.codes)], "w") as log:
            code = subprocess.call(
                self.command(config, options),
                env=torchrun.worker_env(self.env),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.seconds[name] = round(time.time() - start, 1)
        self.codes.append(code)
        return code

    def train_then_resume(
        self, config: str, resume_config: str, iters: int, echo: Callable[[str], None]
    ) -> Optional[str]:
        """The train job, then, where it saved a checkpoint, the resume job; the
        checkpoint (None: none saved)."""
        echo(
            f"train: {self.cards} card(s), {iters} iteration(s), checkpoint, validation "
            f"({self.logs[0]})"
        )
        code = self.run("train", config, [])
        checkpoint = last_checkpoint(self.work_dir)
        if code == 0 and checkpoint:
            echo(f"resume: from iteration {iters}, one more ({self.logs[1]})")
            self.run("resume", resume_config, resume_options(checkpoint, iters))
        return checkpoint

    def failed(self) -> bool:
        return any(code != 0 for code in self.codes)

    def log(self, index: int) -> str:
        """The text of job ``index``'s log."""
        with open(self.logs[index]) as f:
            return f.read()

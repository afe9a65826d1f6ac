"""``GCUWatchdogHook``: a rank that hangs ends the job in bounded time, and is named.

A hung rank (stopped with SIGSTOP, or a card that stops answering) blocks every other rank
in its next collective, until the process-group timeout (30 minutes), and then the
launcher names whichever healthy rank exited first. Here every rank runs a thread that
publishes its heartbeat (:mod:`mmgcu.runtime.heartbeat`) and reads the others'. When no rank has
progressed for ``timeout`` seconds, the rank the others wait for is named in one message,
with its host, pid, card and phase, and stopped: a rank whose heartbeat stopped is killed
(SIGKILL) by a healthy rank of its node, so the launcher names it as the root cause; a rank
whose thread still runs while its main thread is stuck exits by itself.

The main thread does no per-iteration work for it: the thread reads ``runner.iter``
(and the validation loop's batch index) itself. Slow phases get ``slow_timeout``: a rank's
first iteration (graph compilation), rank 0 computing validation metrics, and rank 0
writing a checkpoint, for which the other ranks wait outside any collective
(:meth:`GCUWatchdogHook.saving`), so no collective timeout covers a save.

Config: ``env_cfg.watchdog = dict(timeout=300, interval=2, slow_timeout=1800)``, or
``False`` to turn it off; ``timeout`` defaults to ``env_cfg.dist_cfg.timeout`` when that
is given. One process has no watchdog.
"""

import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
import traceback
from typing import Dict, List

from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.registry import HOOKS

from ...binding import CardBound
from ...errors import GCUError
from ...runtime import heartbeat as hb

DEFAULT_TIMEOUT = 300.0  # steady training: half NCCL's 10 minutes (docs/reliability.md)
DEFAULT_SLOW_TIMEOUT = 1800.0  # first iteration, metrics, checkpoint saves
DEFAULT_INTERVAL = 2.0
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class NoWatchdog:
    """What a runner without a watchdog holds (one process, or ``watchdog=False``)."""

    def saving(self):
        return contextlib.nullcontext()

    def explain(self, exc) -> None:
        """Nothing to add to a failed collective."""

    def stand_down(self) -> None:
        """Nothing watches."""


def build_watchdog(env_cfg: dict, distributed: bool):
    """A run's watchdog from ``env_cfg.watchdog`` (:class:`NoWatchdog` when none)."""
    env_cfg = env_cfg or {}
    cfg = env_cfg.get("watchdog", {})
    if cfg is False or not distributed:
        return NoWatchdog()
    cfg = dict(cfg or {})
    unknown = set(cfg) - {"timeout", "interval", "slow_timeout"}
    if unknown:
        raise GCUError(
            f"env_cfg.watchdog has unknown key(s) {sorted(unknown)}: it takes timeout, "
            "interval and slow_timeout (seconds), or is False to turn the watchdog off"
        )
    given = (env_cfg.get("dist_cfg") or {}).get("timeout")
    cfg.setdefault("timeout", given if given is not None else DEFAULT_TIMEOUT)
    cfg.setdefault("slow_timeout", max(DEFAULT_SLOW_TIMEOUT, cfg["timeout"]))
    return GCUWatchdogHook(**cfg)


@HOOKS.register_module()
class GCUWatchdogHook(CardBound, Hook):
    """Heartbeats of this rank, and the end of a job that a stuck rank blocks.

    A heartbeat names this rank's card: the current card of the accelerator ``GCURunner``
    binds to the hook, read on the main thread (a device's current card is per thread).

    Args:
        timeout: seconds without progress on any rank, in steady training or validation,
            after which the job ends.
        interval: seconds between heartbeats (and checks).
        slow_timeout: the same bound while the rank the job waits for is in a slow phase.
    """

    priority = "LOWEST"  # its after_train follows the checkpoint hook's last save

    def __init__(self, timeout=DEFAULT_TIMEOUT, interval=DEFAULT_INTERVAL, slow_timeout=None):
        self.timeout = float(timeout)
        self.interval = float(interval)
        self.slow_timeout = float(slow_timeout if slow_timeout is not None else timeout)
        self.silent_after = max(3 * self.interval, 5.0)
        self.phase = "start"
        self.saves = 0
        self.acted = False
        self.stood_down = False
        self.runner, self.start, self.rank, self.card = None, 0, 0, ""
        self._validation = None
        self._seq = 0
        self._cpu: Dict[int, tuple] = {}
        self._states: Dict[int, str] = {}  # /proc states of this host's silent ranks
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        self.observer = hb.Observer()

    # -- hooks (once per run or per validation, never per iteration) ---------------------
    def before_train(self, runner) -> None:
        self.runner, self.start = runner, runner.iter
        self.host, self.rank = socket.gethostname(), runner.rank
        if self.accelerator is not None:
            self.card = self.accelerator.current_device()
        self.folder = hb.beat_dir(runner.work_dir, runner.timestamp)
        os.makedirs(self.folder, exist_ok=True)
        if self.rank == 0:  # it holds the work dir's lock: no other job beats here
            hb.remove_other_runs(self.folder)
        self._publish()
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, name="mmgcu-watchdog", daemon=True)
        self._thread.start()

    def before_val(self, runner) -> None:
        self._validation = runner.val_loop
        self._set("val")

    def after_val(self, runner) -> None:
        self._set("train" if self.runner is not None else "start")

    def after_train(self, runner) -> None:
        self._set("done")
        self._stop.set()

    def _set(self, phase: str) -> None:
        self.phase = phase
        if self._thread is not None:
            self._publish()

    @contextlib.contextmanager
    def saving(self):
        """Rank 0 writes a checkpoint; the others wait for it here, outside any collective
        (where the collective timeout would end a healthy job if the save were slow)."""
        if self._thread is None:
            yield
            return
        before = self.phase
        self._set("save" if self.rank == 0 else "wait")
        try:
            yield
            self.saves += 1
            if self.rank != 0:
                self._wait_for_rank0()
        finally:
            self._set(before)

    def _wait_for_rank0(self) -> None:
        deadline = time.monotonic() + self.slow_timeout
        unseen_since = time.monotonic()
        while time.monotonic() < deadline:
            beat = hb.read_beats(self.folder).get(0)
            if beat is None:
                if time.monotonic() - unseen_since > self.silent_after:
                    return  # rank 0's beats are not visible here (a work dir per node)
            elif beat["saves"] >= self.saves or beat["phase"] == "done":
                return
            else:
                unseen_since = time.monotonic()
            time.sleep(0.05)

    # -- the thread ------------------------------------------------------------------------
    def _watch(self) -> None:
        failures = 0
        while not self._stop.wait(self.interval):
            try:
                self._tick()
            except Exception as e:  # never let the watchdog take a healthy job down
                failures += 1
                if failures == 1:
                    print_log(f"mmgcu: the watchdog failed once: {e!r}", "current", logging.WARNING)

    def _tick(self) -> None:
        now = time.monotonic()
        self._publish()
        beats = hb.read_beats(self.folder)
        self.observer.update(beats, now)
        stall = self.observer.stall(now)
        if stall < self.timeout or self.acted:
            return
        verdict = hb.diagnose(beats, self._silent(beats, now))
        # A stopped process (state T) never resumes by itself, whatever phase it was in.
        stopped = verdict.how == "silent" and all(
            self._states.get(r) == "T" for r in verdict.culprits
        )
        bound = self.slow_timeout if verdict.slow and not stopped else self.timeout
        if stall >= bound:
            why = f"nothing has progressed for {stall:.0f} s (bound {bound:g} s)"
            self._act(verdict, beats, why, late=stall >= bound + max(30.0, 5 * self.interval))

    def _beat(self) -> dict:
        runner, phase, step = self.runner, self.phase, 0
        if phase == "start" and runner.iter > self.start:
            phase = "train"
        if phase == "val":
            phase, step = _val_phase(self._validation)
        self._seq += 1
        beat = dict(rank=self.rank, host=self.host, pid=os.getpid(), ppid=os.getppid())
        beat.update(card=self.card, phase=phase, iter=runner.iter)
        beat.update(start=self.start, step=step, saves=self.saves, seq=self._seq)
        mine = self.observer.seen.get(self.rank)
        idle = mine is not None and time.monotonic() - mine["moved"] > self.interval
        beat["where"] = _main_thread_at() if idle else ""  # only while this rank stands still
        return beat

    def _publish(self) -> None:
        with self._lock:
            hb.write_beat(self.folder, self._beat())

    def _silent(self, beats: Dict[int, dict], now: float) -> List[int]:
        """Ranks whose beat stopped: stopped or frozen processes, waiting for rank 0's save
        or not (not ones busy in native code without releasing the GIL, nor ones that
        have exited or finished: the launcher reports those)."""
        silent, self._states = [], {}
        for rank, beat in beats.items():
            if beat["phase"] == "done" or self.observer.silence(rank, now) < self.silent_after:
                continue
            if beat["host"] == self.host:
                state = hb.process_state(beat["pid"])
                if state is None or (state[0] != "T" and self._busy(rank, state)):
                    continue
                self._states[rank] = state[0]
            silent.append(rank)
        return silent

    def _busy(self, rank: int, state: tuple) -> bool:
        previous, self._cpu[rank] = self._cpu.get(rank), (time.monotonic(), state[1])
        if previous is None:
            return True  # judged at the next look
        used = (state[1] - previous[1]) / _TICKS
        return state[0] == "R" or used > 0.5 * (time.monotonic() - previous[0])

    # -- ending the job ----------------------------------------------------------------
    def explain(self, exc) -> None:
        """A collective failed on this rank: stop a peer whose heartbeat has stopped."""
        if self._thread is None or self.acted:
            return
        now = time.monotonic()
        beats = hb.read_beats(self.folder)
        self.observer.update(beats, now)
        silent = self._silent(beats, now)
        if silent:
            first = (str(exc).splitlines() or [""])[0][:160]
            self._act(hb.diagnose(beats, silent), beats, f"a collective failed: {first}")

    def stand_down(self) -> None:
        """This rank's job is ending for a cause already named (a peer's failure): its wait
        for the launcher is no hang, so from here on this rank does not end itself, not even
        on a verdict its thread has begun (a loaded host can take longer than the bound to
        stop the job). It goes on beating as it was, so the other ranks' clocks run on."""
        with self._lock:
            self.acted = self.stood_down = True

    def _act(self, verdict: hb.Verdict, beats: Dict[int, dict], why: str, late=False) -> None:
        """Stop the job if this rank is the one to: the stuck rank itself when its thread
        runs, else the first healthy rank of its host (which can kill it), else the first
        healthy rank; ``late``: the one designated has not, so the first healthy rank."""
        culprits = [r for r in verdict.culprits if r in beats]
        healthy = sorted(r for r in beats if r not in culprits)
        if not culprits:
            if self.rank == min(beats):
                self._end(_unknown(beats, why, self.timeout))
        elif verdict.how != "silent" and self.rank in culprits:
            self._end(_message(verdict, beats, why, "it exits") if self.rank == culprits[0] else "")
        elif verdict.how == "silent":
            host = beats[culprits[0]]["host"]
            neighbours = [r for r in healthy if beats[r]["host"] == host]
            if neighbours and neighbours[0] == self.rank and self._claim():
                self._kill(verdict, beats, why)
            elif not neighbours and healthy and healthy[0] == self.rank:
                self._end(_message(verdict, beats, why, f"rank {self.rank} exits"))
        if late and healthy and healthy[0] == self.rank and self._claim():
            self._end(_message(verdict, beats, why, f"rank {self.rank} exits") if culprits else "")

    def _claim(self) -> bool:
        """Whether this rank may act (once)."""
        with self._lock:
            if self.acted:
                return False
            self.acted = True
            return True

    def _kill(self, verdict: hb.Verdict, beats: Dict[int, dict], why: str) -> None:
        """SIGKILL stuck ranks started by this rank's launcher (they show as its failure).
        Done even after this rank stood down: the kill was claimed first, and it names the
        stuck rank, which a stopped process would otherwise never let the launcher do."""
        if not all(beats[r]["ppid"] == os.getppid() for r in verdict.culprits):
            self._end(_message(verdict, beats, why, f"rank {self.rank} exits"))
        states = {r: self._states.get(r, "?") for r in verdict.culprits}
        self._log(_message(verdict, beats, why, f"rank {self.rank} kills it (SIGKILL)", states))
        for rank in verdict.culprits:
            with contextlib.suppress(OSError):
                os.kill(beats[rank]["pid"], signal.SIGKILL)

    def _log(self, message: str) -> None:
        self.runner.logger.error(f"mmgcu: {message}")
        sys.stderr.flush()

    def _end(self, message) -> None:
        """Exit this process now (its main thread is stuck, or the job must end)."""
        with self._lock:
            if self.stood_down:
                return
        if message:
            self._log(message)
        os._exit(1)


def _val_phase(loop) -> tuple:
    """``('val', batch)``, or ``('evaluate', batch)`` once the last batch has started (the
    metrics follow) or when the loop does not say which batch it runs."""
    step = getattr(loop, "step", None)
    try:
        last = len(loop.dataloader) - 1
    except TypeError:
        last = -1
    return ("evaluate" if step is None or step >= last else "val"), step or 0


def _main_thread_at() -> str:
    """The innermost frames of the main thread, ``file:line function`` (for messages)."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    if frame is None:
        return ""
    frames = traceback.extract_stack(frame)[-3:]
    return " < ".join(f"{_short(f.filename)}:{f.lineno} {f.name}" for f in reversed(frames))


def _short(path: str) -> str:
    for marker in ("site-packages/", "dist-packages/", "mmgcu/"):
        if marker in path:
            return (marker if marker == "mmgcu/" else "") + path.split(marker, 1)[1]
    return path


def _who(beat: dict) -> str:
    card = f", card {beat['card']}" if beat.get("card") != "" else ""
    return f"rank {beat['rank']} (host {beat['host']}, pid {beat['pid']}{card})"


def _silent_how(states: set) -> str:
    """What a silent process is, from its ``/proc`` states (empty: on another host)."""
    if states == {"T"}:
        return "the process is stopped (state T: SIGSTOP or a debugger)"
    if states and "T" not in states:
        return "the process is frozen, using no CPU (a card that stopped answering?)"
    return "the process is stopped (SIGSTOP, a debugger) or frozen (a card that stopped answering)"


def _message(verdict, beats: Dict[int, dict], why: str, action: str, states=None) -> str:
    stuck = [beats[r] for r in verdict.culprits]
    others = [b for r, b in sorted(beats.items()) if r not in verdict.culprits]
    how = {
        "silent": f"its heartbeat stopped: {_silent_how(set((states or {}).values()))}",
        "behind": "its process runs but its main thread has not moved, while the others "
        "are ahead of it",
        "elsewhere": "its main thread is not in a collective, while the others wait in one",
    }[verdict.how]
    where = "; ".join(f"rank {b['rank']} at {b['where']}" for b in stuck if b.get("where"))
    waiting = ", ".join(str(b["rank"]) for b in others)
    return (
        f"the job is stuck on {', '.join(_who(b) for b in stuck)}, "
        f"{'last heard in' if verdict.how == 'silent' else 'in'} "
        f"{hb.describe(stuck[0])}: {how}. {why[:1].upper()}{why[1:]}"
        + (f"; ranks {waiting} wait in {hb.describe(others[0])}" if others else "")
        + (f". Main thread: {where}" if where else "")
        + f". To end the job now, {action}. Check that card (efsmi) and host; if the rank "
        "was only slow, raise env_cfg.watchdog.timeout (or slow_timeout)."
    )


def _unknown(beats: Dict[int, dict], why: str, timeout: float) -> str:
    where = "; ".join(f"rank {r} at {b.get('where') or '?'}" for r, b in sorted(beats.items()))
    first = beats[min(beats)]
    return (
        f"the job is stuck: {why}, and no rank is behind or silent (all in "
        f"{hb.describe(first)}, every main thread in a collective), so mmgcu cannot tell "
        f"which card or link stopped. Main threads: {where}. Ending the job; check the "
        f"cards (efsmi) and the network, or raise env_cfg.watchdog.timeout ({timeout:g} s)."
    )

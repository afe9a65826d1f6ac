"""A hook the ``host_reads`` runs of bench.py import: what each rank's training loop read
back from its card.

``custom_imports = dict(imports=['mmgcu', 'host_reads_probe'])`` (with this folder on
PYTHONPATH) registers :class:`HostReadsProbeHook`. At ``before_train`` and ``after_train``
it reads the simulator's per-process counters (host-side numbers: reading them is no read
of a card value): the host reads (``.item()`` and the like, copies to the CPU) and the
simulated torch_gcu 1.x graph runs. Its priority is the lowest, so the window is the loop
and every other hook's ``before_train``/``after_train`` work around it is inside or outside
it as it is for the loop (``before_train`` of the others first, their ``after_train``
flushes included). Each rank writes ``host_reads_rank{R}.json`` in the work dir.
"""

import json
import os
import os.path as osp

from mmengine.hooks import Hook
from mmengine.registry import HOOKS

#: The torch_gcu 1.x counters of ``mmgcu.sim.state.counters`` copied into the report.
GRAPH_COUNTERS = ("optimizer_step", "unlazy", "sync_lived_tensor", "synchronize")


def _snapshot():
    import mmgcu
    from mmgcu import sim
    from mmgcu.sim import graph

    if not sim.is_installed():
        raise RuntimeError("host_reads_probe needs the simulator (MMGCU_SIMULATE)")
    reads = sim.state.ext.host_reads()
    snap = {k: int(reads[k]) for k in ("scalar_reads", "copies_to_host")}
    snap["host_reads"] = int(sim.state.host_reads())
    snap.update({k: int(sim.state.counters[k]) for k in GRAPH_COUNTERS})
    # the simulated card's lazy graph: its runs, whatever cut them (0 on a 2.x card)
    snap["graph_runs"] = graph.graph_runs(graph.counters()) if sim.state.api == "gcu1" else 0
    snap["api"] = sim.state.api
    snap["mmgcu_file"] = mmgcu.__file__
    return snap


@HOOKS.register_module()
class HostReadsProbeHook(Hook):
    priority = "LOWEST"

    def __init__(self):
        self.before = None
        self.start_iter = None
        self.by_iter = []  # host reads so far at the end of each iteration (host numbers)

    def before_train(self, runner):
        self.before = _snapshot()
        self.start_iter = runner.iter

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        from mmgcu import sim

        self.by_iter.append(int(sim.state.host_reads()))

    def after_train(self, runner):
        after = _snapshot()
        report = dict(
            rank=runner.rank,
            world_size=runner.world_size,
            iters=runner.iter - self.start_iter,
            before=self.before,
            after=after,
            delta={k: after[k] - self.before[k] for k in after if isinstance(after[k], int)},
            reads_by_iter=self.by_iter,
            message_hub=type(runner.message_hub).__name__,
            defer_scalars=runner.cfg.get("gcu_defer_scalars", True),
            pid=os.getpid(),
        )
        with open(osp.join(runner.work_dir, f"host_reads_rank{runner.rank}.json"), "w") as f:
            json.dump(report, f)

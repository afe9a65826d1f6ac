"""A hook the end-to-end configs import, so each rank reports what it trained on.

After training, every rank writes ``probe_rank{R}.json`` in the work dir: where each
parameter and buffer lives, the wrapper's classes, and a checksum of its weights.
"""

import json
import os
import os.path as osp

import torch
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS


def _sim_count(name):
    """A counter of the simulated torch_gcu in this rank (None off the simulator)."""
    from mmgcu import sim

    return sim.state.counters[name] if sim.is_installed() else None


def _step_graph_runs():
    """The simulated T20 card's graph runs at a step (``unlazy``, ``sync_lived_tensor``)
    in this rank, not those of reads; None off a T20 card."""
    from mmgcu import sim

    if not sim.is_installed() or sim.state.api != "gcu1":
        return None
    from mmgcu.sim import graph

    return graph.counters()["runs.step"]


@HOOKS.register_module()
class ProbeHook(Hook):
    priority = "LOWEST"

    def __init__(self):
        self.batch_devices = set()
        self.logits_dtypes = set()

    def before_train(self, runner):
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        head = getattr(getattr(model, "decode_head", None), "conv_seg", None)
        if head is not None:  # the decode head's logits, as the loss sees them
            head.register_forward_hook(lambda m, i, o: self.logits_dtypes.add(str(o.dtype)))

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        for value in (outputs or {}).values():
            if isinstance(value, torch.Tensor):
                self.batch_devices.add(str(value.device))

    def after_train(self, runner):
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        params = {str(p.device) for p in model.parameters()}
        buffers = {str(b.device) for b in model.buffers()}

        def checksum(tensors):
            return sum(
                float(t.detach().cpu().double().abs().sum())
                for t in tensors
                if t.is_floating_point()
            )

        report = dict(
            rank=runner.rank,
            local_rank=int(os.environ.get("LOCAL_RANK", "-1")),
            world_size=runner.world_size,
            param_devices=sorted(params),
            buffer_devices=sorted(buffers),
            loss_devices=sorted(self.batch_devices),
            wrapper_mro=[c.__name__ for c in type(runner.model).__mro__],
            optim_wrapper=[c.__name__ for c in type(runner.optim_wrapper).__mro__],
            logits_dtypes=sorted(self.logits_dtypes),
            lazy_steps=_sim_count("optimizer_step"),
            unlazy_calls=_sim_count("unlazy"),
            empty_cache_calls=_sim_count("empty_cache"),
            graph_runs=_step_graph_runs(),
            param_checksum=checksum(model.parameters()),
            buffer_checksum=checksum(model.buffers()),
            iter=runner.iter,
        )
        with open(osp.join(runner.work_dir, f"probe_rank{runner.rank}.json"), "w") as f:
            json.dump(report, f)

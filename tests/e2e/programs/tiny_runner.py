"""A GCURunner over a two-weight model and a list dataset: a training job in seconds,
for the checkpoint and resume programs. One process, on the simulated card."""

import torch
from mmengine.model import BaseModel

import mmgcu


class Net(BaseModel):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(2, 2)

    def forward(self, x, mode="loss"):
        return dict(loss=self.fc(x).sum())


def runner(work_dir, name, max_iters=4, batch=2, keep=-1, model=None, **kwargs):
    """A runner that saves every 2 iterations (``keep``: max_keep_ckpts)."""
    return mmgcu.GCURunner(
        model=model or Net(),
        work_dir=str(work_dir),
        experiment_name=name,
        train_dataloader=dict(
            dataset=[dict(x=torch.ones(2))] * 16,
            sampler=dict(type="DefaultSampler", shuffle=False),
            collate_fn=dict(type="default_collate"),
            batch_size=batch,
        ),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)),
        train_cfg=dict(by_epoch=False, max_iters=max_iters),
        default_hooks=dict(
            checkpoint=dict(type="CheckpointHook", interval=2, by_epoch=False, max_keep_ckpts=keep)
        ),
        **kwargs,
    )

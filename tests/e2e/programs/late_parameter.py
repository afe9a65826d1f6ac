"""A model that creates a parameter in its first forward pass, on the CPU, trained by
GCURunner on the simulated card; mmgcu must stop it at the end of that forward pass."""

import os

import torch
from tiny_runner import Net, runner


class LateNet(Net):
    def forward(self, x, mode="loss"):
        if not hasattr(self, "scale"):  # born after wrapping, outside the optimizer
            self.scale = torch.nn.Parameter(torch.ones(1))
        return dict(loss=(self.fc(x).sum() * self.scale.to(x.device)).sum())


runner(os.environ["WORK_DIR"], "late_parameter", model=LateNet()).train()

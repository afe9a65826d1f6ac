"""Models torch_gcu/core/random.py of a 1.x release: ``manual_seed_all`` only (no
``manual_seed``), for seeds that fit in 32 bits. A new seed also restarts the seed chain of
each card's lazy graph (torch_xla's SetRngSeed, which the 1.x runtime forks)."""

import torch

from ... import state

__all__ = ["manual_seed_all"]


def manual_seed_all(seed: int) -> None:
    seed = int(seed)
    if seed < 0 or seed > 4294967295:
        raise ValueError(f"Seed must be a unint32 number which is between 0~4294967295, got {seed}")
    # Card ops run on the host, so their random numbers come from the CPU generator too.
    torch.default_generator.manual_seed(seed)
    for card in range(state.cards):
        state.ext.manual_seed(card, seed)
        state.ext.graph_restart_seed(card)

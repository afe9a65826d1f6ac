"""What a training loop's logging does to a message hub, for ``tests/engine/test_message_hub.py``.

Feeds one sequence of updates and reads, as mmengine's hooks make them in a training loop
(``ParamSchedulerHook``/``RuntimeInfoHook``: the lr; ``IterTimerHook``: data time, time and
a read of the time; ``RuntimeInfoHook``: the losses and accuracy, card tensors;
``LoggerHook``: every scalar at its interval), to a ``CardMessageHub`` (a
``MessageHub``) and to a stock ``MessageHub`` given the same values as ``.item()`` gives
them. Prints the host reads each made and both hubs' scalars. Run with MMGCU_SIMULATE=1.
"""

import json
import sys

import torch
from mmengine.logging import MessageHub

import mmgcu  # noqa: F401  (installs the simulator)
from mmgcu.engine.message_hub import CardMessageHub
from mmgcu.sim import state

ITERS, INTERVAL = int(sys.argv[1]), int(sys.argv[2])
KEYS = ("train/loss", "train/decode.loss_ce", "train/decode.acc_seg")


def run(hub, card):
    torch.manual_seed(0)
    reads, logged = state.host_reads(), []
    for it in range(1, ITERS + 1):
        hub.update_scalar("train/lr", 0.01 / it)
        hub.update_scalar("train/data_time", 0.001 * it)
        values = torch.rand(len(KEYS), device=card) * 10  # the step's results, on the card
        for key, value in zip(KEYS, values):
            hub.update_scalar(key, value if isinstance(hub, CardMessageHub) else value.item())
        hub.update_scalar("train/time", 0.1 + 0.01 * it)
        hub.get_scalar("train/time").current()  # IterTimerHook's ETA
        if it % INTERVAL == 0:  # LoggerHook
            logged.append({k: v.mean(INTERVAL) for k, v in hub.log_scalars.items()})
    return state.host_reads() - reads, logged


def scalars(hub):
    return {k: [b.data[0].tolist(), b.data[1].tolist()] for k, b in hub.log_scalars.items()}


card = torch.device(state.device_type, 0)
card_hub, stock_hub = CardMessageHub("card"), MessageHub("stock")
card_reads, card_logged = run(card_hub, card)
stock_reads, stock_logged = run(stock_hub, card)
result = dict(card_reads=card_reads, stock_reads=stock_reads)
result.update(card_logged=card_logged, stock_logged=stock_logged)
result.update(card_scalars=scalars(card_hub), stock_scalars=scalars(stock_hub))
print(json.dumps(result))

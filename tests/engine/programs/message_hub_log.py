"""What a training loop's logging does to a message hub, for ``tests/engine/test_message_hub.py``.

Feeds one sequence of updates and reads, as mmengine's hooks make them in a training loop
(``ParamSchedulerHook``/``RuntimeInfoHook``: the lr; ``IterTimerHook``: data time, time and
a read of the time; ``RuntimeInfoHook``: the losses and accuracy, card tensors;
``LoggerHook``: every scalar at its interval), to a ``CardMessageHub`` (a
``MessageHub``) and to a stock ``MessageHub`` given the same values as ``.item()`` gives
them. Prints the host reads each made and both hubs' scalars. Run with MMGCU_SIMULATE=1.
With ``MMGCU_SIMULATE=t20:1`` (a lazy card) a third hub seals each iteration's scalars and
the iteration's graph outputs the stacks (as GCURuntimeInfoHook and the step do): the
graphs its reads run are counted too.
"""

import json
import sys

import torch
from mmengine.logging import MessageHub

import mmgcu  # noqa: F401  (installs the simulator)
from mmgcu.engine.message_hub import CardMessageHub
from mmgcu.sim import graph, state

ITERS, INTERVAL = int(sys.argv[1]), int(sys.argv[2])
KEYS = ("train/loss", "train/decode.loss_ce", "train/decode.acc_seg")


def run(hub, card, sealed=False):
    torch.manual_seed(0)
    reads, logged, read_graphs = state.host_reads(), [], 0
    for it in range(1, ITERS + 1):
        hub.update_scalar("train/lr", 0.01 / it)
        hub.update_scalar("train/data_time", 0.001 * it)
        values = torch.rand(len(KEYS), device=card) * 10  # the step's results, on the card
        for key, value in zip(KEYS, values):
            hub.update_scalar(key, value if isinstance(hub, CardMessageHub) else value.item())
        if sealed:  # the iteration's end: its graph outputs the stack of its scalars
            state.ext.graph_sync(hub.seal())
        hub.update_scalar("train/time", 0.1 + 0.01 * it)
        hub.get_scalar("train/time").current()  # IterTimerHook's ETA
        if it % INTERVAL == 0:  # LoggerHook
            before = graphs()
            logged.append({k: v.mean(INTERVAL) for k, v in hub.log_scalars.items()})
            read_graphs += graphs() - before
    return state.host_reads() - reads, logged, read_graphs


def graphs():
    return graph.graph_runs(graph.counters()) if state.api == "gcu1" else 0


def scalars(hub):
    return {k: [b.data[0].tolist(), b.data[1].tolist()] for k, b in hub.log_scalars.items()}


card = torch.device(state.device_type, 0)
card_hub, stock_hub = CardMessageHub("card"), MessageHub("stock")
card_reads, card_logged, card_graphs = run(card_hub, card)
stock_reads, stock_logged, _ = run(stock_hub, card)
result = dict(card_reads=card_reads, stock_reads=stock_reads, card_graphs=card_graphs)
result.update(card_logged=card_logged, stock_logged=stock_logged)
result.update(card_scalars=scalars(card_hub), stock_scalars=scalars(stock_hub))
if state.api == "gcu1":
    sealed_hub = CardMessageHub("sealed")
    sealed_reads, sealed_logged, sealed_graphs = run(sealed_hub, card, sealed=True)
    result.update(sealed_reads=sealed_reads, sealed_logged=sealed_logged)
    result.update(sealed_graphs=sealed_graphs, sealed_scalars=scalars(sealed_hub))
print(json.dumps(result))

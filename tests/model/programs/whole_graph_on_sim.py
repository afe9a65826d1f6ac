"""A stock mmseg model on one simulated T20 card, as it is and kept whole by mmgcu.

Run with ``MMGCU_SIMULATE=t20:1``. Trains mmseg's EncoderDecoder (ResNetV1c-18 at an eighth
of its width, FCN head, CrossEntropyLoss with ``avg_non_ignore=True``) for four steps on
label maps whose ignored border changes every step, then validates twelve images of twelve
sizes; once stock, once after ``keep_graph_whole``. Prints the graph runs and compiles of
each step and of the validation as one JSON line.
"""

import json
import sys

import torch

sys.path.insert(0, ".")
import mmgcu  # noqa: E402, F401 (installs the simulator)
from mmgcu.model.whole_graph import keep_graph_whole  # noqa: E402
from tests.conformance import programs as P  # noqa: E402
from tests.conformance.backends import backend, delta  # noqa: E402

be = backend("sim")
CFG = dict(
    P.TINY,
    decode_head=dict(
        P.TINY["decode_head"],
        loss_decode=dict(type="CrossEntropyLoss", loss_weight=1.0, avg_non_ignore=True),
    ),
)
SIZES = [(32, 32 + 4 * k) for k in range(6)] + [(32 + 4 * k, 32) for k in range(1, 7)]


def run(whole: bool) -> dict:
    from mmengine.optim import OptimWrapper

    cfg = dict(CFG, data_preprocessor=dict(CFG["data_preprocessor"], size=(32, 32)))
    model = P._build(cfg, "cpu")
    changed = keep_graph_whole(model) if whole else []
    model = model.to(be.device).train()
    wrapper = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
    steps = []
    for i in range(4):
        batch = P._batch([P._sample(32, 32, border=1 + i, seed=2 * i + k) for k in range(2)])
        before = be.counts()
        log_vars = model.train_step(batch, wrapper)
        be.step()
        steps.append(delta(be.counts(), before))
        del log_vars
    model.eval()
    before = be.counts()
    shapes = []
    for i, (h, w) in enumerate(SIZES):
        with torch.no_grad():
            outputs = model.val_step(P._batch([P._sample(h, w, seed=100 + i)]))
        shapes.append(list(outputs[0].pred_sem_seg.shape))
        outputs[0].pred_sem_seg.data.cpu()  # the metric reads the prediction
    return dict(changed=changed, steps=steps, val=delta(be.counts(), before), shapes=shapes)


print(json.dumps(dict(stock=run(False), whole=run(True), sizes=SIZES)))

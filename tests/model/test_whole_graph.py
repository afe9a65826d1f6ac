"""What keeps a stock mmseg model to one graph a step and a few graph shapes on a lazy card
(``mmgcu/model/whole_graph.py``): the same numbers as mmseg's own code, and on a simulated
T20 card one graph a step and a graph per shape bucket."""

import copy
import json

import pytest
import torch

from mmgcu.model.whole_graph import bucket_side, changes, keep_graph_whole
from tests.conformance import programs as P
from tests.conftest import REPO, run_program


def test_bucket_sides_are_32_and_48_times_powers_of_two():
    assert [bucket_side(s) for s in (1, 32, 33, 48, 49, 96, 97, 500, 512, 683, 1025)] == [
        32,
        32,
        48,
        48,
        64,
        96,
        128,
        512,
        512,
        768,
        1536,
    ]
    assert bucket_side(40, divisor=32) == 64  # 48, then a multiple of the divisor


def _fcn(avg_non_ignore=False):
    cfg = P._fcn_r50()
    cfg["decode_head"]["loss_decode"] = dict(
        type="CrossEntropyLoss", loss_weight=1.0, avg_non_ignore=avg_non_ignore
    )
    return P._build(cfg, "cpu")


@pytest.fixture(scope="module")
def pair():
    """Stock FCN-R50 (decode and auxiliary heads) and a copy kept whole."""
    stock = _fcn(avg_non_ignore=True)
    whole = copy.deepcopy(stock)
    return stock, whole, keep_graph_whole(whole)


def test_each_change_is_a_subclass_of_the_stock_class_with_its_state(pair):
    stock, whole, changed = pair
    assert changed == changes(whole)["changed"]
    assert any(line.startswith("FCNHead x2: acc_seg") for line in changed)
    assert any(line.startswith("CrossEntropyLoss x1: avg_non_ignore") for line in changed)
    assert any(line.startswith("EncoderDecoder x1: predictions") for line in changed)
    assert any(line.startswith("SegDataPreProcessor x1: batches") for line in changed)
    for a, b in zip(stock.modules(), whole.modules()):
        assert isinstance(b, type(a))
    assert stock.state_dict().keys() == whole.state_dict().keys()
    assert keep_graph_whole(whole) == changed  # a second call changes nothing more
    copy.deepcopy(whole)  # an EMA hook copies the model


def test_training_gives_the_stock_losses_and_accuracies(pair):
    stock, whole, _ = pair
    batch = P._batch([P._sample(64, 64, border=3 + k, seed=k) for k in range(2)])
    losses = []
    for model in (stock, whole):
        model.train()
        data = model.data_preprocessor(copy.deepcopy(batch), True)
        torch.manual_seed(0)
        losses.append({k: v.item() for k, v in model(**data, mode="loss").items()})
    assert losses[0].keys() == losses[1].keys() >= {"decode.acc_seg", "aux.acc_seg"}
    for key, value in losses[0].items():
        assert losses[1][key] == pytest.approx(value, rel=1e-6), key


def test_validation_crops_the_bucket_back_to_each_images_size(pair):
    stock, whole, _ = pair
    batch = P._batch([P._sample(50, 70, seed=5)])
    predictions = []
    for model in (stock, whole):
        model.eval()
        with torch.no_grad():
            predictions.append(model.val_step(copy.deepcopy(batch))[0])
    assert predictions[1].pad_shape == (64, 96)  # 50 x 70 padded to its bucket
    assert predictions[1].pred_sem_seg.shape == predictions[0].pred_sem_seg.shape == (50, 70)
    agree = predictions[0].pred_sem_seg.data == predictions[1].pred_sem_seg.data
    assert agree.float().mean() > 0.9  # only the context near the padded edges differs


def test_a_model_that_is_not_mmseg_is_left_as_it_is():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    assert keep_graph_whole(model) == [] and changes(model) == dict(changed=[], kept=[])


def test_a_head_with_its_own_loss_is_named_not_changed():
    cfg = dict(P.TINY, decode_head=dict(P.TINY["decode_head"], type="STDCHead"))
    model = P._build(cfg, "cpu")
    keep_graph_whole(model)
    assert changes(model)["kept"] == ["STDCHead x1"]


def test_on_a_simulated_t20_card_one_graph_a_step_and_one_per_bucket():
    """Stock: 4 graphs a step (two masked indexings, a read of avg_non_ignore's divisor)
    and a new one compiled every step, as the ignored border changes; a graph per image
    size in validation. Kept whole: one graph a step, none compiled after the first two,
    and validation compiles one per bucket (twelve sizes, five buckets)."""
    proc = run_program(f"{REPO}/tests/model/programs/whole_graph_on_sim.py", MMGCU_SIMULATE="t20:1")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    stock, whole = out["stock"], out["whole"]
    assert [s["runs"] for s in stock["steps"]] == [4, 4, 4, 4]
    assert [s["compiles"] for s in stock["steps"]][1:] == [1, 1, 1]
    assert stock["steps"][1]["fallbacks"] == {
        "aten::nonzero": 2,
        "aten::_local_scalar_dense": 1,
    }
    assert stock["val"]["compiles"] == len(out["sizes"]) == 12
    assert [s["runs"] for s in whole["steps"]] == [1, 1, 1, 1]
    assert [s["compiles"] for s in whole["steps"]] == [1, 1, 0, 0]
    assert whole["val"] == dict(runs=12, compiles=5, fallbacks={})
    assert whole["shapes"] == out["sizes"]  # each prediction at its image's size

"""GCUPSAMask and convert_gcu_mmcv_ops: mmcv's PSAMask from ordinary ops, for GCU cards.

The reference is mmcv's own compiled PSAMask on the CPU: forward values and the input
gradient of a random weighted sum must be equal (both are copies of input values, so exactly).
On simulated cards, stock PSAMask fails (mmcv has no kernel for the device) and GCUPSAMask
gives the CPU's values without a host read.
"""

import copy

import pytest
import torch
import torch.nn as nn

from mmgcu.model import GCUPSAMask, convert_gcu_mmcv_ops
from tests.conftest import SIM_APIS, last_json, run_python
from tests.sim.helpers import DEVICE_TYPE

ops = pytest.importorskip("mmcv.ops", reason="mmcv has no compiled ops here (mmcv-lite?)")

PSA_TYPES = ("collect", "distribute")
#: (mask_size, feature H x W): square and non-square masks, odd and even (half = (m-1)//2),
#: maps larger and smaller than the mask, and mmseg's PSANet mask (97, 97) on a small map.
CASES = [
    ((3, 3), (9, 11)),
    ((5, 3), (7, 6)),
    ((4, 6), (5, 8)),
    ((7, 7), (3, 4)),
    ((97, 97), (5, 4)),
]


def run_both(psa_type, mask_size, shape, batch=2, seed=0):
    """(stock output, GCU output, stock input grad, GCU input grad) for one random input."""
    g = torch.Generator().manual_seed(seed)
    h, w = shape
    x = torch.randn(batch, mask_size[0] * mask_size[1], h, w, generator=g)
    weight = torch.randn(batch, h * w, h, w, generator=g)
    results = []
    for layer in (ops.PSAMask(psa_type, mask_size), GCUPSAMask(psa_type, mask_size)):
        xi = x.clone().requires_grad_()
        out = layer(xi)
        (out * weight).sum().backward()
        results.append((out.detach(), xi.grad))
    (ref, ref_grad), (out, grad) = results
    return ref, out, ref_grad, grad


@pytest.mark.parametrize("psa_type", PSA_TYPES)
@pytest.mark.parametrize("mask_size, shape", CASES)
def test_forward_and_backward_equal_mmcv(psa_type, mask_size, shape):
    ref, out, ref_grad, grad = run_both(psa_type, mask_size, shape)
    assert out.shape == ref.shape == (2, shape[0] * shape[1]) + shape
    assert out.is_contiguous()
    assert torch.equal(out, ref)
    assert torch.equal(grad, ref_grad)
    # zeros too: outputs outside the mask (small masks) or inputs outside the map (large)
    assert (ref != 0).any() and ((ref == 0).any() or (ref_grad == 0).any())


@pytest.mark.parametrize("psa_type", PSA_TYPES)
def test_non_contiguous_input(psa_type):
    x = torch.randn(2, 7, 6, 15).permute(0, 3, 2, 1)  # (2, 15, 6, 7), channels last
    ref = ops.PSAMask(psa_type, (5, 3))(x.contiguous())
    assert torch.equal(GCUPSAMask(psa_type, (5, 3))(x), ref)


@pytest.mark.parametrize("psa_type", PSA_TYPES)
def test_int_mask_size_is_square(psa_type):
    x = torch.randn(1, 9, 5, 6)
    assert torch.equal(GCUPSAMask(psa_type, 3)(x), ops.PSAMask(psa_type, 3)(x))


def test_psa_type_as_mmcv_names_it():
    for psa_type, enum in (("collect", 0), ("distribute", 1)):
        for arg in (psa_type, enum):
            layer = GCUPSAMask(arg, (3, 5))
            assert (layer.psa_type, layer.psa_type_enum, layer.mask_size) == (
                psa_type,
                enum,
                (3, 5),
            )
    with pytest.raises(ValueError, match="psa_type"):
        GCUPSAMask("both", (3, 3))
    with pytest.raises(ValueError, match="9 channels"):
        GCUPSAMask("collect", (3, 3))(torch.zeros(1, 8, 4, 4))


def test_convert_replaces_psamask_and_leaves_the_rest():
    conv, relu = nn.Conv2d(3, 9, 1), nn.ReLU()
    inner = nn.Sequential(ops.PSAMask("distribute", (5, 3)))
    model = nn.Sequential(conv, ops.PSAMask("collect", (3, 3)), relu, inner)
    model.eval()
    reference = copy.deepcopy(model)
    keys = list(model.state_dict())

    converted, replaced = convert_gcu_mmcv_ops(model)

    assert converted is model
    assert replaced == [("PSAMask", 2)]
    assert model[0] is conv and model[2] is relu and model[3] is inner
    for layer, (psa_type, mask) in (
        (model[1], ("collect", (3, 3))),
        (inner[0], ("distribute", (5, 3))),
    ):
        assert type(layer) is GCUPSAMask
        assert (layer.psa_type, tuple(layer.mask_size)) == (psa_type, mask)
        assert not layer.training
    assert list(model.state_dict()) == keys
    assert not any(isinstance(m, ops.PSAMask) for m in model.modules())
    x, y = torch.randn(1, 3, 6, 5), torch.randn(1, 15, 6, 5)
    assert torch.equal(model[:2](x), reference[:2](x))
    assert torch.equal(inner(y), reference[3](y))


def test_convert_a_psamask_itself():
    converted, replaced = convert_gcu_mmcv_ops(ops.PSAMask("collect", (3, 3)))
    assert type(converted) is GCUPSAMask and replaced == [("PSAMask", 1)]


def test_model_without_psamask_comes_back_unchanged():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Sequential(nn.ReLU()))
    children = list(model.modules())
    converted, replaced = convert_gcu_mmcv_ops(model)
    assert converted is model and replaced == []
    assert list(model.modules()) == children
    assert convert_gcu_mmcv_ops(GCUPSAMask("collect", (3, 3)))[1] == []


def test_mmseg_psa_head_gives_the_same_output_and_gradients():
    """mmseg's PSAHead (both directions), converted, against itself with mmcv's PSAMask."""
    psa_head = pytest.importorskip("mmseg.models.decode_heads.psa_head")
    torch.manual_seed(0)
    head = psa_head.PSAHead(
        mask_size=(7, 7),
        psa_type="bi-direction",
        compact=False,
        shrink_factor=2,
        in_channels=8,
        channels=4,
        num_classes=3,
        norm_cfg=dict(type="BN"),
    )
    converted, replaced = convert_gcu_mmcv_ops(copy.deepcopy(head))
    assert replaced == [("PSAMask", 2)]
    x = torch.randn(2, 8, 9, 10)
    outs = []
    for model in (head, converted):
        model.train()
        torch.manual_seed(1)  # the same dropout
        out = model([x])
        out.square().sum().backward()
        outs.append((out.detach(), [p.grad for p in model.parameters()]))
    (ref, ref_grads), (out, grads) = outs
    assert torch.allclose(out, ref, rtol=1e-6, atol=1e-6)
    for grad, ref_grad in zip(grads, ref_grads):
        assert torch.allclose(grad, ref_grad, rtol=1e-5, atol=1e-6)


# -- simulated cards ------------------------------------------------------------------------
ON_CARD = """
import json
import torch
import mmgcu  # (installs the simulated torch_gcu)
import mmgcu.sim.state
from mmcv.ops import PSAMask
from mmgcu.device import select_accelerator
from mmgcu.model import GCUPSAMask

card = select_accelerator("gcu").device(0)
out = {"device": None, "stock_error": None, "host_reads": 0, "equal": []}
for psa_type in ("collect", "distribute"):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 15, 6, 7, generator=g)
    weight = torch.randn(2, 42, 6, 7, generator=g)
    xr = x.clone().requires_grad_()
    ref = PSAMask(psa_type, (5, 3))(xr)
    (ref * weight).sum().backward()
    xc = x.to(card).requires_grad_()
    wc = weight.to(card)
    reads = mmgcu.sim.state.host_reads()
    y = GCUPSAMask(psa_type, (5, 3))(xc)
    (y * wc).sum().backward()
    out["host_reads"] += mmgcu.sim.state.host_reads() - reads
    out["device"] = str(y.device)
    out["equal"].append(torch.equal(y.cpu(), ref) and torch.equal(xc.grad.cpu(), xr.grad))
try:
    PSAMask("collect", (5, 3))(x.to(card))
except Exception as e:  # what mmcv says about a device it has no kernel for
    out["stock_error"] = str(e)
print(json.dumps(out))
"""


@pytest.mark.parametrize("api", SIM_APIS)
def test_on_simulated_card(api):
    out = last_json(run_python(ON_CARD, MMGCU_SIMULATE=1, MMGCU_SIMULATE_API=api).stdout)
    card = f"{DEVICE_TYPE[api]}:0"
    assert out["device"] == card
    assert out["equal"] == [True, True]
    assert out["host_reads"] == 0
    assert "not found" in out["stock_error"] and card in out["stock_error"]

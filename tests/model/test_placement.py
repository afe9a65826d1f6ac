"""mmgcu.model.placement: what is off the card, said the same way everywhere, and the first batch.

The "card" is the meta device, so a module or batch left on the CPU is off it.
"""

import pytest
import torch
from mmengine.model import BaseDataPreprocessor

from mmgcu.device import GCUError
from mmgcu.model.placement import check_placement, misplaced, misplaced_message, watch_first_batch
from tests.fakes import ConvBN

CARD = torch.device("meta")


def linears(n=4):
    return torch.nn.Sequential(*[torch.nn.Linear(2, 2) for _ in range(n)])


# -- misplaced / misplaced_message / check_placement ---------------------------------------


def test_misplaced_lists_parameters_then_buffers():
    module = ConvBN()

    wrong = misplaced(module, CARD)

    names = [name for name, _ in wrong]
    assert names[:4] == ["conv.weight", "conv.bias", "bn.weight", "bn.bias"]
    assert set(names[4:]) == {"bn.running_mean", "bn.running_var", "bn.num_batches_tracked"}
    assert {device for _, device in wrong} == {torch.device("cpu")}
    assert misplaced(module, torch.device("cpu")) == []


def test_one_misplaced_buffer_is_found():
    module = ConvBN().to(CARD)
    module.bn.running_mean = torch.zeros(4)
    assert misplaced(module, CARD) == [("bn.running_mean", torch.device("cpu"))]


def test_message_names_the_first_five_and_the_count():
    wrong = misplaced(linears(), CARD)

    message = misplaced_message("rank 3", CARD, wrong)

    shown = "0.weight on cpu, 0.bias on cpu, 1.weight on cpu, 1.bias on cpu, 2.weight on cpu"
    assert message.startswith(
        f"rank 3: 8 parameter(s)/buffer(s) are not on its card meta: {shown} ..."
    )
    assert "2.bias" not in message
    assert "let GCURunner move the model to the card" in message


def test_message_without_more_has_no_ellipsis():
    message = misplaced_message("rank 0", "gcu:1", [("bn.running_mean", "cpu")])
    assert "1 parameter(s)/buffer(s) are not on its card gcu:1: bn.running_mean on cpu." in message
    assert " ..." not in message


def test_check_placement_raises_the_message():
    with pytest.raises(GCUError) as err:
        check_placement(linears(), CARD, "rank 5")
    assert str(err.value) == misplaced_message("rank 5", CARD, misplaced(linears(), CARD))


def test_check_placement_passes_a_placed_module():
    check_placement(linears().to(CARD), CARD, "rank 0")


# -- watch_first_batch ------------------------------------------------------------------------


class Preprocessor(BaseDataPreprocessor):
    """Returns the batch where ``device`` says (a custom preprocessor that forgets to move)."""

    def __init__(self, device="cpu"):
        super().__init__()
        self.target = device

    def forward(self, data, training=False):
        return {
            key: [t.to(self.target) for t in value]
            if isinstance(value, list)
            else value.to(self.target)
            for key, value in data.items()
        }


class Model(torch.nn.Module):
    def __init__(self, preprocessor):
        super().__init__()
        self.data_preprocessor = preprocessor


def batch():
    return dict(inputs=torch.ones(2, 3), data_samples=[torch.zeros(1), torch.zeros(1)])


def test_a_batch_left_on_the_cpu_is_refused_once():
    preprocessor = Preprocessor("cpu")
    watch_first_batch(Model(preprocessor), CARD)

    with pytest.raises(GCUError) as err:
        preprocessor(batch())

    message = str(err.value)
    assert message.startswith("the data preprocessor (Preprocessor) returned a batch on cpu, ")
    assert "but the model is on meta" in message
    assert "BaseDataPreprocessor.cast_data" in message
    preprocessor(batch())  # the check has removed itself: later batches pass unchecked


def test_a_batch_on_the_card_passes_and_the_check_goes():
    preprocessor = Preprocessor(CARD)
    watch_first_batch(Model(preprocessor), CARD)

    preprocessor(batch())
    preprocessor.target = "cpu"
    preprocessor(batch())  # not checked again


def test_a_tensor_deep_in_the_batch_is_found():
    class Nested(BaseDataPreprocessor):
        def forward(self, data, training=False):
            on_card = torch.ones(1, device=CARD)
            return (on_card, [on_card, {"x": on_card, "y": [torch.ones(1)]}], "text")

    preprocessor = Nested()
    watch_first_batch(Model(preprocessor), CARD)
    with pytest.raises(GCUError, match="returned a batch on cpu, but"):
        preprocessor({})


def test_a_model_without_a_preprocessor_module_is_left_alone():
    model = torch.nn.Linear(1, 1)
    watch_first_batch(model, CARD)
    model(torch.ones(1))
    not_a_module = Model(None)
    not_a_module.data_preprocessor = lambda data: data
    watch_first_batch(not_a_module, CARD)
    assert not_a_module.data_preprocessor(1) == 1

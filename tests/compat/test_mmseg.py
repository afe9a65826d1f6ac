"""mmgcu.compat.mmseg: the mmseg code mmgcu runs in another form on a lazy card, pinned to
the upstream source it mirrors, and giving mmseg's values."""

import hashlib
import inspect

import mmseg
import pytest
import torch

from mmgcu.compat import mmseg as compat


@pytest.mark.parametrize("qualified", sorted(compat.UPSTREAM))
def test_upstream_source_is_the_one_mirrored(qualified):
    digest = hashlib.sha256(compat.upstream_source(qualified).encode()).hexdigest()
    assert digest == compat.UPSTREAM[qualified], (
        f"mmseg {mmseg.__version__}'s {qualified} differs from the mmseg "
        f"{compat.MMSEG_VERSION} one mmgcu.compat.mmseg relies on: read the change, update "
        f"the piece that uses it, then record {digest!r}"
    )


def test_a_changed_upstream_body_is_noticed(monkeypatch):
    from mmseg.models.losses.accuracy import accuracy

    assert compat.changed_upstream() == {}
    real = inspect.getsource

    def doctored(obj):
        source = real(obj)
        return source.replace("100.0", "1.0") if obj is accuracy else source

    monkeypatch.setattr(inspect, "getsource", doctored)
    assert list(compat.changed_upstream()) == ["mmseg.models.losses.accuracy.accuracy"]


@pytest.mark.parametrize("border", [0, 3, 8])
def test_the_static_accuracy_is_mmsegs(border):
    from mmseg.models.losses import accuracy

    torch.manual_seed(border)
    pred = torch.randn(2, 5, 8, 8)
    target = torch.randint(0, 5, (2, 8, 8))
    target[:, :border] = 255
    expected = accuracy(pred, target, ignore_index=255)
    given = compat.static_accuracy(pred, target, ignore_index=255)
    assert given.shape == expected.shape == (1,)
    assert given.item() == pytest.approx(expected.item(), rel=1e-6)


def test_an_image_of_no_valid_pixel_has_mmsegs_accuracy():
    from mmseg.models.losses import accuracy

    pred, target = torch.randn(1, 3, 4, 4), torch.full((1, 4, 4), 255)
    assert compat.static_accuracy(pred, target, 255).item() == pytest.approx(
        accuracy(pred, target, ignore_index=255).item()
    )

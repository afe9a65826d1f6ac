"""mmgcu.runtime.rank_warnings: OpenMMLab's warnings on rank 0 only; a user's on every rank."""

import warnings

import pytest

from mmgcu.runtime.rank_warnings import launcher_rank, show_library_warnings_on_rank_0


def shown(module: str) -> bool:
    """Whether a warning raised in ``module`` is shown, under the filters now in place."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")
        show_library_warnings_on_rank_0()
        warnings.warn_explicit("The draw is False", UserWarning, "x.py", 1, module=module)
    return len(seen) == 1


@pytest.fixture
def rank(monkeypatch):
    for name in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"):
        monkeypatch.delenv(name, raising=False)
    return lambda r, name="RANK": monkeypatch.setenv(name, str(r))


def test_rank_0_shows_every_warning(rank):
    rank(0)
    assert shown("mmseg.engine.hooks.visualization_hook") and shown("my_project.losses")


@pytest.mark.parametrize("var", ["RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"])
def test_other_ranks_show_only_warnings_outside_openmmlab(rank, var):
    rank(3, var)
    assert launcher_rank() == 3
    for module in ("mmseg.models.losses.cross_entropy_loss", "mmengine.runner", "mmcv"):
        assert not shown(module), module
    for module in ("my_project.losses", "torch.nn.modules.module", "mmsegx"):
        assert shown(module), module


def test_without_a_launcher_the_process_is_rank_0(rank):
    assert launcher_rank() == 0 and shown("mmseg.models.builder")

"""mmgcu.runtime.excepthook: the narrow sys.excepthook and the two failures it words.

The hook is installed over a recording previous hook and called as Python calls it, with
the exception's type, value and traceback. Two tests check who installs it: ``import mmgcu``
on a GCU host, and ``GCURunner``.
"""

import sys
import types
from unittest import mock

import pytest

from mmgcu.device import GCUError
from mmgcu.runtime import excepthook as errors
from tests.conftest import run_python


@pytest.fixture
def previous(monkeypatch):
    """The hook that was there before mmgcu's (a recorder); mmgcu's is installed over it."""
    recorder = mock.Mock(spec=[])  # a bare callable: no attribute marks it as mmgcu's
    monkeypatch.setattr(sys, "excepthook", recorder)
    monkeypatch.delenv("MMGCU_TRACEBACK", raising=False)
    errors.install()
    return recorder


@pytest.fixture
def gcu_host(monkeypatch):
    """torch_gcu is importable here."""
    monkeypatch.setitem(sys.modules, "torch_gcu", types.ModuleType("torch_gcu"))


@pytest.fixture
def cuda_host(monkeypatch):
    """No torch_gcu (this machine has none; none is imported)."""
    monkeypatch.delitem(sys.modules, "torch_gcu", raising=False)


def raised(fn):
    """(type, value, traceback) of what ``fn`` raises."""
    try:
        fn()
    except BaseException:
        return sys.exc_info()
    raise AssertionError("nothing raised")


def _init_dist_pytorch():  # named as mmengine's, where a stock Runner fails on a GCU host
    raise RuntimeError("Found no NVIDIA driver on your system.")


def elsewhere():
    raise RuntimeError("Found no NVIDIA driver on your system.")


def test_a_gcu_error_is_printed_alone(previous, capsys):
    def fail():
        raise GCUError("no card is visible to local rank 0: ...")

    sys.excepthook(*raised(fail))

    assert capsys.readouterr().err == "\nmmgcu: no card is visible to local rank 0: ...\n"
    previous.assert_not_called()


def test_a_subclass_of_gcu_error_too(previous, capsys):
    class Mine(GCUError):
        pass

    sys.excepthook(*raised(lambda: (_ for _ in ()).throw(Mine("x"))))

    assert capsys.readouterr().err == "\nmmgcu: x\n"


def test_other_errors_reach_the_previous_hook_untouched(previous, capsys):
    info = raised(lambda: {}["missing"])

    sys.excepthook(*info)

    previous.assert_called_once_with(*info)
    assert capsys.readouterr().err == ""


def test_a_stock_runner_on_a_gcu_host_is_told_about_runner_type(
    previous, gcu_host, monkeypatch, capsys
):
    monkeypatch.delenv("RANK", raising=False)
    sys.excepthook(*raised(_init_dist_pytorch))

    err = capsys.readouterr().err
    assert err == (
        "\nRuntimeError: Found no NVIDIA driver on your system.\n"
        f"mmgcu: {errors.RUNNER_TYPE_MISSING}\n"
    )
    assert "runner_type = 'GCURunner'" in errors.RUNNER_TYPE_MISSING
    previous.assert_not_called()


class _Cfg(dict):
    """A config as mmengine's Runner.from_cfg receives it (a mapping with ``get``)."""


def from_cfg(cfg):  # named as mmengine's Runner.from_cfg, which stock test.py calls
    _init_dist_pytorch()


def test_a_script_that_ignores_runner_type_is_named_with_mmgcu_test(
    previous, gcu_host, monkeypatch, capsys
):
    """mmseg's tools/test.py builds a plain Runner from a config that sets runner_type."""
    monkeypatch.setattr(sys, "argv", ["/site/mmseg/.mim/tools/test.py", "cfg.py", "ckpt.pth"])
    monkeypatch.setenv("RANK", "0")
    sys.excepthook(*raised(lambda: from_cfg(_Cfg(runner_type="GCURunner"))))

    err = capsys.readouterr().err
    assert "test.py builds mmengine's own Runner whatever runner_type says" in err
    assert "runner_type = 'GCURunner'" in err and "mmgcu test CONFIG CHECKPOINT" in err
    assert errors.RUNNER_TYPE_MISSING not in err
    previous.assert_not_called()


def test_only_rank_0_explains_a_stock_runner(previous, gcu_host, monkeypatch, capsys):
    monkeypatch.setenv("RANK", "3")
    sys.excepthook(*raised(lambda: from_cfg(_Cfg())))
    assert capsys.readouterr().err == "mmgcu: rank 3 stops: rank 0 says why\n"


def reduce_mean(tensor):  # as mmdet's, which Mask2Former's loss calls
    raise RuntimeError("ProcessGroupGloo::allreduce: unsupported device type xla")


def test_a_card_tensor_in_a_torch_distributed_collective_names_the_caller(
    previous, gcu_host, monkeypatch, capsys
):
    """torch_gcu 1.x: a gloo group refuses card tensors (mmgcu's gloo_eccl takes them)."""
    monkeypatch.setenv("RANK", "0")
    sys.excepthook(*raised(lambda: reduce_mean(None)))

    err = capsys.readouterr().err
    assert "test_excepthook.py:" in err
    assert "(reduce_mean) calls torch.distributed's allreduce" in err
    assert "on a card tensor (xla) in a group whose backend is gloo" in err
    assert "gloo_eccl" in err and "without backend='gloo'" in err
    previous.assert_not_called()
    monkeypatch.setenv("RANK", "1")
    sys.excepthook(*raised(lambda: reduce_mean(None)))
    assert capsys.readouterr().err == "mmgcu: rank 1 stops: rank 0 says why\n"


def test_the_same_collective_error_off_a_gcu_host_is_left_alone(previous, cuda_host):
    info = raised(lambda: reduce_mean(None))
    sys.excepthook(*info)
    previous.assert_called_once_with(*info)


def test_the_same_error_on_a_host_without_torch_gcu_is_cudas_own(previous, cuda_host, capsys):
    info = raised(_init_dist_pytorch)
    sys.excepthook(*info)
    previous.assert_called_once_with(*info)


def test_a_cuda_error_outside_init_dist_is_left_alone(previous, gcu_host):
    info = raised(elsewhere)
    sys.excepthook(*info)
    previous.assert_called_once_with(*info)


def test_another_error_in_init_dist_is_left_alone(previous, gcu_host):
    def _init_dist_slurm():
        raise KeyError("SLURM_PROCID")

    info = raised(_init_dist_slurm)
    sys.excepthook(*info)
    previous.assert_called_once_with(*info)


@pytest.mark.parametrize("fail", [lambda: (_ for _ in ()).throw(GCUError("x")), _init_dist_pytorch])
def test_mmgcu_traceback_keeps_the_full_traceback(previous, gcu_host, monkeypatch, fail):
    monkeypatch.setenv("MMGCU_TRACEBACK", "1")
    info = raised(fail)
    sys.excepthook(*info)
    previous.assert_called_once_with(*info)


def test_installing_twice_wraps_once(previous):
    hook = sys.excepthook
    errors.install()
    assert sys.excepthook is hook


def test_import_mmgcu_installs_it_on_a_gcu_host_only():
    """On a GCU host (here simulated) the import installs it: a script that builds
    mmengine's own Runner fails there before any other mmgcu code runs. Elsewhere the
    import leaves sys.excepthook alone."""
    code = "import sys, mmgcu; print(getattr(sys.excepthook, 'mmgcu', False), flush=True); "
    code += "raise mmgcu.GCUError('demo failure')"
    on_gcu = run_python(code, check=False, MMGCU_SIMULATE=1)
    assert on_gcu.returncode == 1 and on_gcu.stdout.splitlines()[-1] == "True"
    assert on_gcu.stderr.endswith("\nmmgcu: demo failure\n")
    assert "Traceback" not in on_gcu.stderr

    elsewhere = run_python(code, check=False)
    assert elsewhere.returncode == 1 and elsewhere.stdout.splitlines()[-1] == "False"
    assert "Traceback" in elsewhere.stderr


def test_gcu_runner_installs_it(runner_case, monkeypatch):
    """GCURunner installs it wherever it runs (here on the CPU)."""
    from mmgcu import GCURunner

    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    cfg = runner_case.epoch_based_cfg
    cfg.env_cfg = dict(device="cpu")
    GCURunner.from_cfg(cfg)
    assert getattr(sys.excepthook, "mmgcu", False)

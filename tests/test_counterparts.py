"""mmgcu.counterparts: the one stock-to-GCU mapping, resolved without a runner.

Besides the real mapping (mmengine's loops, wrappers, log processor and hooks), two toy
stock classes live in a registry of their own: ``Stock`` (replaced on GCU cards only) and
``StockEverywhere`` (replaced on every kind of device).
"""

import logging
from unittest import mock

import pytest
import torch
from mmengine.config import Config, ConfigDict
from mmengine.hooks import EmptyCacheHook
from mmengine.model import MMDistributedDataParallel
from mmengine.optim import AmpOptimWrapper, OptimWrapper
from mmengine.registry import HOOKS, LOG_PROCESSORS, LOOPS, MODEL_WRAPPERS, OPTIM_WRAPPERS, Registry
from mmengine.runner import LogProcessor, TestLoop, ValLoop

import mmgcu.counterparts as counterparts
from mmgcu import (
    GCU1DistributedDataParallel,
    GCUAmpOptimWrapper,
    GCUDistributedDataParallel,
    GCUEmptyCacheHook,
    GCULogProcessor,
    GCUOptimWrapper,
    GCUTestLoop,
    GCUValLoop,
)
from mmgcu.counterparts import Counterparts, replacement_of, replaces
from tests import fakes

TOYS = Registry("mmgcu_test_counterparts")


@TOYS.register_module()
class Stock:
    pass


@TOYS.register_module()
@replaces(Stock, why="it assumes CUDA", does="it runs on the card")
class GCUStock(Stock):
    pass


@TOYS.register_module()
class StockEverywhere:
    pass


@TOYS.register_module()
@replaces(StockEverywhere, why="it is wrong on every device", does="it is right", everywhere=True)
class GCUEverywhere(StockEverywhere):
    pass


@TOYS.register_module()
class StockStep:
    pass


@TOYS.register_module()
@replaces(
    StockStep, why="it steps on CUDA", does={"lazy": "it runs the graph", "*": "it steps here"}
)
class GCUStep(StockStep):
    pass


class UserLoop(ValLoop):
    """A user's subclass of a replaced stock class."""


class UserGCULoop(GCUValLoop):
    """A user's subclass of a GCU class."""


@pytest.fixture
def logged(monkeypatch):
    """What mmgcu.counterparts logs: a list of (message, level)."""
    recorder = mock.Mock()
    monkeypatch.setattr(counterparts, "print_log", recorder)
    return recorder


def messages(logged, level=None):
    return [
        c.args[0]
        for c in logged.call_args_list
        if level is None or c.kwargs.get("level", logging.INFO) == level
    ]


@pytest.fixture(params=["gcu2", "gcu1"])
def gcu(request, monkeypatch):
    """Each GCU accelerator in turn."""
    return fakes.ACCELERATORS[request.param](monkeypatch)


@pytest.fixture(params=["cuda", "cpu"])
def not_gcu(request, monkeypatch):
    """Each accelerator that is not a GCU in turn."""
    return fakes.ACCELERATORS[request.param](monkeypatch)


@pytest.fixture
def gcu2(monkeypatch):
    return fakes.gcu2(monkeypatch)


# -- the mapping the GCU classes declare ---------------------------------------------------


def test_each_gcu_class_declares_what_it_replaces():
    assert replacement_of(ValLoop) == [GCUValLoop]
    assert replacement_of(TestLoop) == [GCUTestLoop]
    assert replacement_of(OptimWrapper) == [GCUOptimWrapper]
    assert replacement_of(AmpOptimWrapper) == [GCUAmpOptimWrapper]
    assert replacement_of(LogProcessor) == [GCULogProcessor]
    assert replacement_of(EmptyCacheHook) == [GCUEmptyCacheHook]
    ddp = [GCUDistributedDataParallel, GCU1DistributedDataParallel]
    assert replacement_of(MMDistributedDataParallel) == ddp
    assert replacement_of(torch.nn.parallel.DistributedDataParallel) == ddp
    assert replacement_of(GCUValLoop) == []  # nothing stands in for a GCU class


def test_replacement_of_is_a_copy():
    replacement_of(ValLoop).append(object)
    assert replacement_of(ValLoop) == [GCUValLoop]


# -- how a config names the type -------------------------------------------------------------


@pytest.mark.parametrize(
    "given", ["ValLoop", "mmengine.ValLoop", ValLoop], ids=["name", "scoped-name", "class"]
)
def test_a_stock_type_resolves_to_the_gcu_class(gcu, given):
    cfg = dict(type=given, fp16=True)

    resolved = Counterparts(gcu).resolve(cfg, LOOPS)

    assert resolved == dict(type=GCUValLoop, fp16=True)
    assert cfg == dict(type=given, fp16=True)  # the config is not changed


def test_a_config_dict_resolves_to_a_config_dict(gcu):
    cfg = Config(dict(val_cfg=dict(type="ValLoop", fp16=True))).val_cfg

    resolved = Counterparts(gcu).resolve(cfg, LOOPS)

    assert isinstance(resolved, ConfigDict) and resolved.type is GCUValLoop
    assert resolved.fp16 is True and cfg.type == "ValLoop"


def test_the_default_type_stands_for_a_missing_type(gcu):
    cfg = dict(fp16=True)
    assert Counterparts(gcu).resolve(cfg, LOOPS, default="TestLoop") == dict(
        type=GCUTestLoop, fp16=True
    )
    assert "type" not in cfg


def test_a_type_is_left_out_when_there_is_no_default(gcu):
    cfg = dict(after_iter=True)
    assert Counterparts(gcu).resolve(cfg, HOOKS) == dict(after_iter=True)


def test_an_unknown_name_is_left_for_mmengines_own_error(gcu, logged):
    cfg = dict(type="NoSuchLoop")
    assert Counterparts(gcu).resolve(cfg, LOOPS) == dict(type="NoSuchLoop")
    assert logged.call_count == 0


def test_a_type_without_counterpart_becomes_its_class(gcu):
    resolved = Counterparts(gcu).resolve(dict(type="IterBasedTrainLoop"), LOOPS)
    assert resolved["type"] is LOOPS.get("IterBasedTrainLoop")


@pytest.mark.parametrize(
    "given, registry, gcu_class",
    [
        ("OptimWrapper", OPTIM_WRAPPERS, GCUOptimWrapper),
        ("AmpOptimWrapper", OPTIM_WRAPPERS, GCUAmpOptimWrapper),
        ("TestLoop", LOOPS, GCUTestLoop),
        ("LogProcessor", LOG_PROCESSORS, GCULogProcessor),
        ("EmptyCacheHook", HOOKS, GCUEmptyCacheHook),
    ],
)
def test_every_cuda_bound_stock_class_has_its_gcu_class(gcu, given, registry, gcu_class):
    assert Counterparts(gcu).resolve(dict(type=given), registry)["type"] is gcu_class


# -- GCU cards only, or every device -----------------------------------------------------------


def test_gcu_only_classes_stay_stock_off_a_gcu(not_gcu, logged):
    resolver = Counterparts(not_gcu)
    assert resolver.resolve(dict(type="ValLoop"), LOOPS)["type"] is ValLoop
    assert resolver.resolve(dict(type="Stock"), TOYS)["type"] is Stock
    assert logged.call_count == 0


def test_everywhere_classes_are_replaced_off_a_gcu_too(not_gcu):
    assert (
        Counterparts(not_gcu).resolve(dict(type="StockEverywhere"), TOYS)["type"] is GCUEverywhere
    )


def test_toys_are_replaced_on_a_gcu(gcu):
    resolver = Counterparts(gcu)
    assert resolver.resolve(dict(type="Stock"), TOYS)["type"] is GCUStock
    assert resolver.resolve(dict(type=StockEverywhere), TOYS)["type"] is GCUEverywhere


@pytest.mark.parametrize("kind", ["gcu2", "gcu1", "cuda", "cpu"])
@pytest.mark.parametrize("given", ["GCUValLoop", GCUValLoop, UserGCULoop])
def test_a_gcu_class_a_config_names_is_kept(monkeypatch, logged, kind, given):
    accelerator = fakes.ACCELERATORS[kind](monkeypatch)
    resolved = Counterparts(accelerator).resolve(dict(type=given), LOOPS)
    assert resolved["type"] is (GCUValLoop if given == "GCUValLoop" else given)
    assert logged.call_count == 0


# -- DDP: the accelerator names its wrapper ----------------------------------------------------

DDP_TYPES = [
    "MMDistributedDataParallel",
    "DistributedDataParallel",
    MMDistributedDataParallel,
    torch.nn.parallel.DistributedDataParallel,
    "GCUDistributedDataParallel",
    "GCU1DistributedDataParallel",
]


@pytest.mark.parametrize(
    "kind, wrapper",
    [
        ("gcu2", GCUDistributedDataParallel),
        ("gcu1", GCU1DistributedDataParallel),
        ("cuda", GCUDistributedDataParallel),
        ("cpu", GCUDistributedDataParallel),
    ],
)
@pytest.mark.parametrize(
    "given",
    DDP_TYPES,
    ids=["mm-name", "torch-name", "mm-class", "torch-class", "gcu2-name", "gcu1-name"],
)
def test_ddp_resolves_to_the_accelerators_wrapper(monkeypatch, kind, wrapper, given):
    accelerator = fakes.ACCELERATORS[kind](monkeypatch)
    assert wrapper.fits(accelerator)

    resolved = Counterparts(accelerator).resolve(dict(type=given), MODEL_WRAPPERS)

    assert resolved["type"] is wrapper


def test_ddp_default_type(monkeypatch):
    accelerator = fakes.gcu1(monkeypatch)
    resolved = Counterparts(accelerator).resolve(
        dict(broadcast_buffers=False), MODEL_WRAPPERS, default="MMDistributedDataParallel"
    )
    assert resolved == dict(type=GCU1DistributedDataParallel, broadcast_buffers=False)


# -- what is said, and how often -----------------------------------------------------------------


def test_a_substitution_is_logged_once(gcu, logged):
    resolver = Counterparts(gcu)

    for given in ("ValLoop", ValLoop, "mmengine.ValLoop"):
        resolver.resolve(dict(type=given), LOOPS)

    assert messages(logged) == [
        f"mmgcu: GCUValLoop stands in for ValLoop on {gcu.kind}: its fp16 autocasts on the card"
    ]
    assert logged.call_args.kwargs == dict(logger="current")


def test_each_substitution_is_logged(gcu2, logged):
    resolver = Counterparts(gcu2)
    resolver.resolve(dict(type="ValLoop"), LOOPS)
    resolver.resolve(dict(type="TestLoop"), LOOPS)
    resolver.resolve(dict(type="MMDistributedDataParallel"), MODEL_WRAPPERS)
    resolver.resolve(dict(type="DistributedDataParallel"), MODEL_WRAPPERS)
    said = messages(logged)
    assert len(said) == 4
    assert said[2].startswith(
        "mmgcu: GCUDistributedDataParallel stands in for MMDistributedDataParallel on gcu2: "
    )


def test_a_substitution_says_what_the_gcu_class_does_for_the_generation_in_use(gcu, logged):
    """Not what the stock class gets wrong (that read as the GCU class's own flaw), nor a
    fact of the other generation."""
    Counterparts(gcu).resolve(dict(type="OptimWrapper"), OPTIM_WRAPPERS)
    Counterparts(gcu).resolve(dict(type="CheckpointHook"), HOOKS)
    optim, checkpoint = messages(logged)
    assert optim.startswith(f"mmgcu: GCUOptimWrapper stands in for OptimWrapper on {gcu.kind}: ")
    assert ("torch_gcu.optimizer_step" in optim) == gcu.lazy
    assert "loses none" in checkpoint and "can lose every checkpoint" not in checkpoint


def test_what_is_said_follows_what_the_accelerator_can_do(gcu, logged):
    """A text per capability of the accelerator (here ``lazy``), ``'*'`` for the rest."""
    Counterparts(gcu).resolve(dict(type="StockStep"), TOYS)
    does = "it runs the graph" if gcu.lazy else "it steps here"
    assert messages(logged) == [f"mmgcu: GCUStep stands in for StockStep on {gcu.kind}: {does}"]


def test_a_declaration_has_a_text_for_every_accelerator():
    declare = replaces(Stock, why="it assumes CUDA", does={"lazy": "it runs the graph"})
    with pytest.raises(ValueError, match="does needs a '\\*' text"):
        declare(type("GCUHalfDeclared", (Stock,), {}))
    assert replacement_of(Stock) == [GCUStock]


def test_each_runner_says_it_again(gcu2, logged):
    Counterparts(gcu2).resolve(dict(type="ValLoop"), LOOPS)
    Counterparts(gcu2).resolve(dict(type="ValLoop"), LOOPS)
    assert len(messages(logged)) == 2


def test_a_user_subclass_is_kept_with_one_warning(gcu, logged):
    resolver = Counterparts(gcu)

    assert resolver.resolve(dict(type=UserLoop), LOOPS)["type"] is UserLoop
    assert resolver.resolve(dict(type=UserLoop), LOOPS)["type"] is UserLoop

    (warning,) = messages(logged, logging.WARNING)
    assert warning.startswith("mmgcu: UserLoop subclasses ValLoop, which assumes CUDA (")
    assert "GCUValLoop exists because its fp16 autocasts on get_device()" in warning
    assert warning.endswith("derive it from GCUValLoop to run it on GCU cards.")


def test_a_user_ddp_subclass_is_warned_with_the_kinds_wrapper(monkeypatch, logged):
    class UserDDP(MMDistributedDataParallel):
        pass

    resolver = Counterparts(fakes.gcu1(monkeypatch))

    assert resolver.resolve(dict(type=UserDDP), MODEL_WRAPPERS)["type"] is UserDDP
    (warning,) = messages(logged, logging.WARNING)
    assert "derive it from GCU1DistributedDataParallel" in warning


def test_a_user_subclass_is_not_warned_off_a_gcu(not_gcu, logged):
    assert Counterparts(not_gcu).resolve(dict(type=UserLoop), LOOPS)["type"] is UserLoop
    assert logged.call_count == 0


def test_a_subclass_of_a_gcu_class_is_not_warned(gcu, logged):
    assert Counterparts(gcu).resolve(dict(type=UserGCULoop), LOOPS)["type"] is UserGCULoop
    assert logged.call_count == 0


def test_a_subclass_of_gcu_amp_optim_wrapper_is_not_warned(gcu, logged):
    class UserAmp(GCUAmpOptimWrapper):
        pass

    assert Counterparts(gcu).resolve(dict(type=UserAmp), OPTIM_WRAPPERS)["type"] is UserAmp
    assert messages(logged, logging.WARNING) == []


def test_a_user_amp_subclass_is_told_to_derive_from_the_gcu_amp_wrapper(gcu, logged):
    class UserAmp(AmpOptimWrapper):
        pass

    Counterparts(gcu).resolve(dict(type=UserAmp), OPTIM_WRAPPERS)

    warnings = messages(logged, logging.WARNING)
    assert len(warnings) == 1
    assert "UserAmp subclasses AmpOptimWrapper" in warnings[0]
    assert "derive it from GCUAmpOptimWrapper" in warnings[0]


def test_a_built_stock_object_is_kept_with_one_warning(gcu, logged):
    resolver = Counterparts(gcu)
    hook = EmptyCacheHook()

    assert resolver.resolve(hook, HOOKS) is hook
    assert resolver.resolve(EmptyCacheHook(), HOOKS) is not hook

    (warning,) = messages(logged, logging.WARNING)
    assert warning == (
        "mmgcu: an already built EmptyCacheHook was given, so mmgcu cannot build "
        "GCUEmptyCacheHook instead (it empties only CUDA's cache). Give it as a config dict "
        "(type='EmptyCacheHook')."
    )


def test_a_built_everywhere_object_is_warned_off_a_gcu(not_gcu, logged):
    Counterparts(not_gcu).resolve(StockEverywhere(), TOYS)
    assert len(messages(logged, logging.WARNING)) == 1


@pytest.mark.parametrize("obj", [GCUEmptyCacheHook(), object(), None])
def test_other_objects_pass_without_a_word(gcu, logged, obj):
    assert Counterparts(gcu).resolve(obj, HOOKS) is obj
    assert logged.call_count == 0


def test_a_built_gcu_only_object_is_not_warned_off_a_gcu(not_gcu, logged):
    Counterparts(not_gcu).resolve(Stock(), TOYS)
    assert logged.call_count == 0

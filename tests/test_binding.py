"""GCU classes a config names, built by mmengine's own Runner (as stock tools such as mmseg's
tools/test.py build it whatever runner_type says) or bound to a CPU by GCURunner: they act
as their stock classes, and one log line says so.

Runners are mmengine's real ones, built from ``RunnerTestCase``'s configs.
"""

import copy

import pytest
import torch
from mmengine.logging import MessageHub
from mmengine.runner import Runner

from mmgcu import GCUEmptyCacheHook, GCULogProcessor, GCUOptimWrapper, GCURunner, GCUValLoop
from mmgcu.binding import Binding, CardBound
from mmgcu.device.fallback import CPUAccelerator
from mmgcu.engine.hooks import GCUDevicePlacementHook
from tests import fakes
from tests.conftest import run_log

pytestmark = pytest.mark.usefixtures("fresh_notes")

UNBOUND = "it was not built by GCURunner, so it has no card"


def gcu_config(case):
    """``iter_based_cfg`` naming GCU classes, as a config inheriting gcu_runtime.py does."""
    cfg = copy.deepcopy(case.iter_based_cfg)
    cfg.train_cfg = dict(by_epoch=False, max_iters=4, val_interval=2)
    cfg.log_processor = dict(type="GCULogProcessor", by_epoch=False)
    cfg.val_cfg = dict(type="GCUValLoop")
    cfg.custom_hooks = [
        dict(type="GCUEmptyCacheHook", after_iter=True),
        dict(type="GCUDevicePlacementHook"),
    ]
    return cfg


def built_gcu_objects(runner):
    hooks = [h for h in runner.hooks if isinstance(h, (GCUEmptyCacheHook, GCUDevicePlacementHook))]
    return [runner.log_processor, runner.val_loop, *hooks]


def test_a_plain_runner_trains_a_gcu_config_and_says_so_once(runner_case):
    runner = runner_case.build_runner(gcu_config(runner_case))
    assert type(runner) is Runner

    runner.train()

    built = built_gcu_objects(runner)
    assert [type(o) for o in built] == [
        GCULogProcessor,
        GCUValLoop,
        GCUDevicePlacementHook,  # priority VERY_HIGH: before the NORMAL one
        GCUEmptyCacheHook,
    ]
    assert all(o.accelerator is None for o in built)
    log = run_log(runner)
    assert log.count(UNBOUND) == 1  # one line for all of them
    assert "mmgcu's other classes in this run do the same" in log
    assert "Iter(train) [4/4]" in log and "Iter(val)" in log


def test_a_plain_runner_tests_a_gcu_config(runner_case):
    cfg = gcu_config(runner_case)
    cfg.test_cfg = dict(type="GCUTestLoop")

    metrics = runner_case.build_runner(cfg).test()

    assert metrics == {"acc": 1}


def test_gcu_runner_binds_its_accelerator_to_what_it_builds(runner_case):
    cfg = gcu_config(runner_case)
    cfg.env_cfg = dict(device="cpu")

    runner = GCURunner.from_cfg(cfg)
    runner.train()

    built = built_gcu_objects(runner)
    assert len(built) == 4
    assert all(isinstance(o.accelerator, CPUAccelerator) for o in built)
    assert all(o.accelerator is runner.accelerator for o in built)
    log = run_log(runner)
    assert UNBOUND not in log
    # On the CPU they act as stock classes too, and say why once.
    assert log.count("not on a GCU card") == 1
    assert "this run is on cpu" in log


def test_on_a_gcu_card_nothing_is_said(monkeypatch, runner_case):
    bound = GCULogProcessor(by_epoch=False)
    bound.bind(Binding(fakes.gcu2(monkeypatch)))

    assert bound.card_accelerator() is bound.accelerator
    unbound = GCULogProcessor(by_epoch=False)
    assert unbound.card_accelerator() is None
    assert unbound.bound_accelerator() is None


def test_one_binding_gives_each_gcu_class_what_it_works_on(monkeypatch):
    """Hooks, loops and log processors take the accelerator; optimizer wrappers the model
    and message hub too, from the same binding."""
    gcu2 = fakes.gcu2(monkeypatch)
    model = torch.nn.Linear(1, 1)
    hub = MessageHub("test_binding")
    processor = GCULogProcessor(by_epoch=False)
    wrapper = GCUOptimWrapper(optimizer=torch.optim.SGD(model.parameters(), lr=0.1))

    for built in (processor, wrapper):
        built.bind(Binding(gcu2, model, hub))

    assert processor.card_accelerator() is gcu2
    assert wrapper.card_accelerator() is gcu2
    assert (wrapper.model, wrapper.message_hub) == (model, hub)


def test_each_reason_is_said_once_per_process(monkeypatch):
    said = []
    monkeypatch.setattr("mmgcu.binding.print_log", lambda message, **kw: said.append(message))

    class Thing(CardBound):
        off_card = "does its stock thing"

    for _ in range(3):
        Thing().card_accelerator()
        cpu = Thing()
        cpu.bind(Binding(fakes.cpu()))
        cpu.card_accelerator()

    assert len(said) == 2
    assert said[0].startswith(f"mmgcu: Thing does its stock thing: {UNBOUND}")
    assert said[1].startswith("mmgcu: Thing does its stock thing: this run is on cpu")

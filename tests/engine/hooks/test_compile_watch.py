"""GCUCompileWatchHook: a lazy card that keeps compiling after warm-up is named once, with
the likely cause; a card that reports no count, or an eager one, keeps it silent."""

import logging
import types
from unittest import mock

import pytest

from mmgcu.binding import Binding
from mmgcu.engine.hooks import GCUCompileWatchHook, compile_watch


class Counts:
    """A lazy accelerator whose compile count follows ``counts`` (one per reading)."""

    lazy = True
    is_gcu = True
    kind = "gcu1"

    def __init__(self, counts):
        self.counts = iter(counts)

    def compiled_graphs(self):
        return next(self.counts)


def _runner(iteration):
    return types.SimpleNamespace(iter=iteration)


@pytest.fixture
def warnings(monkeypatch):
    """What the hook logs at warning level."""
    said = []

    def record(msg, logger=None, level=logging.INFO):
        if level >= logging.WARNING:
            said.append(msg)

    monkeypatch.setattr(compile_watch, "print_log", record)
    return said


def _train(hook, iterations):
    for i in range(iterations):
        hook.after_train_iter(_runner(i), i)


def test_compiles_that_keep_growing_after_warm_up_are_named_once(warnings):
    hook = GCUCompileWatchHook(interval=10, windows=2)
    hook.bind(Binding(Counts([5, 6, 7, 8, 9])))  # read at iterations 10, 20, 30, 40, 50
    _train(hook, 50)
    assert len(warnings) == 1
    assert "compiled 1 graph(s) in the last 10 training iterations" in warnings[0]
    assert "mmgcu rehearse CONFIG" in warnings[0]


def test_compiles_that_stop_after_warm_up_say_nothing(warnings):
    hook = GCUCompileWatchHook(interval=10, windows=2)
    hook.bind(Binding(Counts([5, 5, 6, 6, 6])))  # one late compile, not growing
    _train(hook, 50)
    assert warnings == []


@pytest.mark.parametrize("accelerator", ["none", "eager", "no count"])
def test_no_count_no_word(warnings, accelerator):
    hook = GCUCompileWatchHook(interval=1, windows=1)
    if accelerator == "eager":
        hook.bind(Binding(mock.Mock(lazy=False, is_gcu=True, compiled_graphs=lambda: 1 / 0)))
    elif accelerator == "no count":
        hook.bind(Binding(Counts([None] * 10)))
    _train(hook, 10)
    assert warnings == []


def test_a_validation_that_compiles_per_image_is_named(warnings):
    hook = GCUCompileWatchHook(val_graphs=4, val_images_per_compile=4)
    hook.bind(Binding(Counts([10, 40])))
    hook.before_val_epoch(_runner(0))
    for _ in range(60):
        hook.after_val_iter(_runner(0), 0, None, [object()])
    hook.after_val_epoch(_runner(0))
    assert len(warnings) == 1 and "validation compiled 30 graphs for 60 images" in warnings[0]


def test_a_validation_within_its_buckets_says_nothing(warnings):
    hook = GCUCompileWatchHook(val_graphs=8)
    hook.bind(Binding(Counts([10, 16])))  # six buckets for two hundred images
    hook.before_val_epoch(_runner(0))
    for _ in range(200):
        hook.after_val_iter(_runner(0), 0, None, [object()])
    hook.after_val_epoch(_runner(0))
    assert warnings == []

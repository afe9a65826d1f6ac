"""GCURunner itself: real runners built from configs (mmengine's ``RunnerTestCase`` toy
model, data and metric), on the CPU or on faked vendor modules (:mod:`tests.fakes`).

What the runner delegates is tested on its collaborators: the card, the groups and the
wrapped model in ``test_strategy.py``, locks and failure endings in
``test_fault_guard.py``, checkpoint files in ``tests/checkpoint/test_io.py``.
"""

import ast
import copy
import os
import time
from unittest import mock

import mmengine.runner.runner as mm_runner
import pytest
import torch
from mmengine.hooks import EmptyCacheHook, Hook, RuntimeInfoHook
from mmengine.logging import MessageHub
from mmengine.optim import OptimWrapper, OptimWrapperDict
from mmengine.registry import MODEL_WRAPPERS
from mmengine.runner import LogProcessor, Runner, TestLoop, ValLoop

import mmgcu.counterparts as counterparts
import mmgcu.engine.fault_guard as mguard
from mmgcu import (
    CPUCheckpointHook,
    GCUAmpOptimWrapper,
    GCUDevicePlacementHook,
    GCUEmptyCacheHook,
    GCULogProcessor,
    GCUOptimWrapper,
    GCUTestLoop,
    GCUValLoop,
    GCUWatchdogHook,
)
from mmgcu.device import GCUError
from mmgcu.device.fallback import CPUAccelerator
from mmgcu.engine.message_hub import CardMessageHub
from mmgcu.engine.runner import GCURunner
from tests import fakes
from tests.conftest import LAUNCHER_VARS, REPO, free_port, run_log


@pytest.fixture(autouse=True)
def no_locks(monkeypatch):
    """The card and work-dir locks are tests/runtime/test_locks.py's subject."""
    monkeypatch.setattr(mguard, "hold_locks", lambda *args: None)


@pytest.fixture
def build(runner_case):
    """``build(device, **cfg)``: a GCURunner from mmengine's toy config, as
    ``tools/train.py`` builds it (``Runner.from_cfg`` of the config's runner type)."""

    def build(device="cpu", hooks=(), **cfg):
        config = copy.deepcopy(runner_case.epoch_based_cfg)
        config.experiment_name = f"mmgcu_{time.time_ns()}"  # a hub of its own
        config.env_cfg = dict(device=device, **cfg.pop("env_cfg", {}))
        config.merge_from_dict(cfg)
        if not hooks:
            return GCURunner.from_cfg(config)
        # Hook objects cannot be in a Config (it prints itself): given to the runner.
        config = config.to_dict()
        config.update(custom_hooks=list(hooks))
        return GCURunner(**config)

    return build


# -- what __init__ creates ---------------------------------------------------------------------


def test_the_collaborators_share_the_accelerator_the_config_names(build, monkeypatch):
    fakes.gcu2(monkeypatch)  # a GCU is there, but the config names the CPU

    runner = build("cpu")

    assert isinstance(runner.accelerator, CPUAccelerator)
    assert runner.strategy.accelerator is runner.accelerator
    assert runner.guard.accelerator is runner.accelerator
    assert runner.counterparts.accelerator is runner.accelerator
    assert runner.card == 0


def test_gcu_jit_mode_reaches_the_accelerator(build, monkeypatch):
    fakes.gcu1(monkeypatch, on_cpu=True)
    runner = build("gcu1", env_cfg=dict(gcu_jit_mode="SYNC"))
    assert runner.accelerator.summary()["jit_mode"] == "SYNC"


@pytest.fixture
def one_rank_group(monkeypatch):
    """torchrun's variables for a world of one rank (a real gloo group is created)."""
    for name in LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


@pytest.mark.usefixtures("one_rank_group")
def test_mmengines_setup_runs_after_the_group(build, monkeypatch):
    stock_setup, seen = Runner.setup_env, []

    def setup_env(self, env_cfg):
        seen.append(torch.distributed.is_initialized())
        stock_setup(self, env_cfg)

    monkeypatch.setattr(Runner, "setup_env", setup_env)
    init_dist = mock.Mock()
    monkeypatch.setattr(mm_runner, "init_dist", init_dist)

    runner = build("cpu", launcher="pytorch", env_cfg=dict(cudnn_benchmark=True))

    assert seen == [True]  # the group existed when mmengine's set-up began
    init_dist.assert_not_called()  # stock init_dist would call torch.cuda.set_device
    assert (runner.rank, runner.world_size) == (0, 1)
    assert isinstance(runner.guard.watchdog, GCUWatchdogHook)
    assert runner.guard.watchdog in runner.hooks


@pytest.mark.parametrize("diff_rank_seed", [False, True])
def test_set_randomness_seeds_the_cards(build, monkeypatch, diff_rank_seed):
    """torch_gcu 1.x is not reached by torch.manual_seed: the runner seeds the cards."""
    fakes.gcu1(monkeypatch, on_cpu=True)
    runner = build("gcu1")
    monkeypatch.setattr("mmengine.runner.utils.get_rank", lambda: 3)

    runner.set_randomness(seed=7, diff_rank_seed=diff_rank_seed)

    expected = 7 + 3 if diff_rank_seed else 7
    assert runner.seed == expected
    runner.accelerator.torch_gcu.manual_seed_all.assert_called_with(expected)


def test_a_wrapped_model_is_returned_unchanged(build):
    class Wrapped(torch.nn.Module):
        pass

    name = "_MmgcuTestWrapped"
    MODEL_WRAPPERS.register_module(name=name, module=Wrapped, force=True)
    try:
        wrapper = Wrapped()
        assert build().wrap_model(None, wrapper) is wrapper
    finally:
        MODEL_WRAPPERS._module_dict.pop(name, None)


# -- the message hub ----------------------------------------------------------------------------


def test_on_a_card_the_hub_keeps_scalars_and_is_mmengines_current_hub(build, monkeypatch):
    fakes.gcu1(monkeypatch, on_cpu=True)
    runner = build("gcu1")

    assert isinstance(runner.message_hub, CardMessageHub)
    assert isinstance(runner.message_hub, MessageHub)
    assert MessageHub.get_current_instance() is runner.message_hub
    assert runner.message_hub.instance_name == runner.experiment_name


@pytest.mark.parametrize("device, cfg", [("gcu1", dict(gcu_defer_scalars=False)), ("cpu", {})])
def test_elsewhere_the_hub_is_mmengines(build, monkeypatch, device, cfg):
    fakes.gcu1(monkeypatch, on_cpu=True)
    runner = build(device, **cfg)
    assert type(runner.message_hub) is MessageHub


# -- what mmengine builds from the config ---------------------------------------------------------


def sgd_cfg(**kwargs):
    return dict(optimizer=dict(type="SGD", lr=0.1), **kwargs)


def test_optim_wrappers_become_gcu_ones_bound_to_the_card(build, monkeypatch):
    fakes.gcu1(monkeypatch, on_cpu=True)
    runner = build("gcu1")

    plain = runner.build_optim_wrapper(sgd_cfg())
    amp = runner.build_optim_wrapper(sgd_cfg(type="AmpOptimWrapper", dtype="bfloat16"))

    assert type(plain) is GCUOptimWrapper and type(amp) is GCUAmpOptimWrapper
    for wrapper in (plain, amp):
        assert (wrapper.accelerator, wrapper.model) == (runner.accelerator, runner.model)
        assert wrapper.message_hub is runner.message_hub
    assert isinstance(amp.loss_scaler, fakes.FakeGradScaler)
    assert amp.cast_dtype is torch.bfloat16


def test_optim_wrappers_stay_stock_off_a_gcu(build):
    assert type(build().build_optim_wrapper(sgd_cfg())) is OptimWrapper


def test_built_gcu_optim_wrappers_are_bound_too(build, monkeypatch):
    fakes.gcu1(monkeypatch, on_cpu=True)
    runner = build("gcu1")
    first = GCUOptimWrapper(optimizer=torch.optim.SGD(runner.model.parameters(), lr=0.1))
    second = GCUAmpOptimWrapper(optimizer=torch.optim.SGD(runner.model.parameters(), lr=0.1))

    built = runner.build_optim_wrapper(dict(first=first, second=second))

    assert isinstance(built, OptimWrapperDict)
    assert all(w.accelerator is runner.accelerator for w in (first, second))
    assert all(w.model is runner.model for w in (first, second))
    assert runner.build_optim_wrapper(first) is first


def test_a_built_stock_optim_wrapper_on_a_gcu_is_warned(build, monkeypatch):
    fakes.gcu1(monkeypatch, on_cpu=True)
    runner = build("gcu1")
    warned = mock.Mock()
    monkeypatch.setattr(counterparts, "print_log", warned)

    runner.build_optim_wrapper(OptimWrapper(torch.optim.SGD(runner.model.parameters(), lr=0.1)))

    said = [call.args[0] for call in warned.call_args_list]
    assert len(said) == 1 and "an already built OptimWrapper was given" in said[0]


@pytest.mark.parametrize(
    "method, given, gcu_class, stock_class",
    [
        ("build_val_loop", dict(type="ValLoop", fp16=True), GCUValLoop, ValLoop),
        ("build_val_loop", dict(fp16=True), GCUValLoop, ValLoop),
        ("build_test_loop", dict(type="TestLoop"), GCUTestLoop, TestLoop),
        ("build_test_loop", dict(), GCUTestLoop, TestLoop),
        ("build_log_processor", dict(by_epoch=False), GCULogProcessor, LogProcessor),
    ],
)
@pytest.mark.parametrize("kind", ["gcu1", "cpu"])
def test_loops_and_the_log_processor_resolve_their_counterparts(
    build, monkeypatch, method, given, gcu_class, stock_class, kind
):
    fakes.ACCELERATORS[kind](monkeypatch, on_cpu=True)
    runner = build(kind)
    built = []
    monkeypatch.setattr(Runner, method, lambda self, cfg: built.append(cfg) or cfg)

    getattr(runner, method)(given)

    (cfg,) = built
    assert cfg["type"] is (gcu_class if kind == "gcu1" else stock_class)
    assert {k: v for k, v in cfg.items() if k != "type"} == {
        k: v for k, v in given.items() if k != "type"
    }


def test_a_built_loop_passes_through(build, monkeypatch):
    runner = build()
    monkeypatch.setattr(Runner, "build_val_loop", lambda self, loop: loop)
    loop = object()
    assert runner.build_val_loop(loop) is loop


def test_the_built_loops_and_log_processor_are_bound(build, monkeypatch):
    fakes.gcu1(monkeypatch, on_cpu=True)
    runner = build("gcu1")
    assert type(runner.log_processor) is GCULogProcessor
    assert runner.log_processor.accelerator is runner.accelerator
    assert type(runner.val_loop) is GCUValLoop
    assert runner.val_loop.accelerator is runner.accelerator


@pytest.mark.parametrize("kind, expected", [("gcu1", GCUEmptyCacheHook), ("cpu", EmptyCacheHook)])
def test_hooks_resolve_their_counterparts(build, monkeypatch, kind, expected):
    fakes.ACCELERATORS[kind](monkeypatch, on_cpu=True)
    runner = build(kind)

    runner.register_hook(dict(type="EmptyCacheHook", after_iter=True, priority="LOW"))

    (hook,) = [h for h in runner.hooks if isinstance(h, EmptyCacheHook)]
    assert type(hook) is expected and hook.priority == "LOW"
    if kind == "gcu1":
        assert hook.accelerator is runner.accelerator


def test_register_hooks_adds_the_checkpoint_and_placement_hooks(build):
    types = [type(h) for h in build().hooks]

    assert types[:2] == [RuntimeInfoHook, GCUDevicePlacementHook]  # VERY_HIGH
    assert types[-1] is CPUCheckpointHook  # LOWEST: after what other hooks add
    assert len(types) == 8  # mmengine's six default hooks are still there


@pytest.mark.parametrize(
    "listed", [dict(type="GCUDevicePlacementHook"), GCUDevicePlacementHook()], ids=["cfg", "obj"]
)
@pytest.mark.parametrize("kind", ["gcu1", "cpu"])
def test_register_hooks_keeps_a_listed_placement_hook(build, listed, kind, monkeypatch):
    fakes.ACCELERATORS[kind](monkeypatch, on_cpu=True)
    runner = build(
        kind, **(dict(hooks=[listed]) if isinstance(listed, Hook) else dict(custom_hooks=[listed]))
    )
    assert [type(h) for h in runner.hooks].count(GCUDevicePlacementHook) == 1


def test_register_hooks_without_the_placement_check(build):
    types = [type(h) for h in build(gcu_placement_check=False).hooks]
    assert GCUDevicePlacementHook not in types and types[-1] is CPUCheckpointHook


def test_hooks_given_as_objects_are_kept(build, monkeypatch):
    fakes.gcu1(monkeypatch, on_cpu=True)
    runner = build("gcu1")
    mine = Hook()
    runner.register_hook(mine)
    assert [h for h in runner.hooks if type(h) is Hook] == [mine]


# -- checkpoints and the end of a run ------------------------------------------------------------


def test_only_rank_0_writes(build, tmp_path, monkeypatch):
    runner = build()
    monkeypatch.setattr("mmengine.dist.utils.get_rank", lambda group=None: 1)
    runner.save_checkpoint(str(tmp_path), "iter_4.pth")
    assert os.listdir(tmp_path) == []


def test_rank_0_writes_atomically(build, tmp_path):
    runner = build()
    runner.save_checkpoint(
        str(tmp_path), "iter_4.pth", save_optimizer=False, save_param_scheduler=False
    )
    assert os.listdir(tmp_path) == ["iter_4.pth"]
    assert "meta" in torch.load(str(tmp_path / "iter_4.pth"), map_location="cpu")


def same(a, b) -> bool:
    """Whether two loaded checkpoints (or parts) hold the same keys, values and tensors."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    return a == b


class AddsWeights(Hook):
    """Adds 32 MB of weights to each checkpoint (32 tensors), as an EMA hook adds its model."""

    weights = {f"w{i}": torch.full((1 << 18,), float(i)) for i in range(32)}
    nbytes = 32 * 4 * (1 << 18)

    def before_save_checkpoint(self, runner, checkpoint):
        checkpoint["ema_state_dict"] = dict(self.weights)


def peak_python_memory(save) -> int:
    """The most memory Python's allocator held for objects during ``save()`` (where an
    ``io.BytesIO`` keeps its bytes; torch 1.10's torch.save also passes each storage through
    it, one at a time; torch's tensors are not counted)."""
    import tracemalloc

    tracemalloc.start()
    try:
        save()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_checkpoint_is_mmengines_written_straight_to_its_file(build, tmp_path):
    """Every key and tensor mmengine's Runner.save_checkpoint writes, with its hooks; but
    torch.save writes to the file, where mmengine first pickles the checkpoint into an
    io.BytesIO (a second copy in host memory: 4.6 GB of fresh pages for ViT-L's 2.4 GB)."""
    runner = build(hooks=[AddsWeights()], param_scheduler=dict(type="MultiStepLR", milestones=[1]))
    runner.optim_wrapper = runner.build_optim_wrapper(runner.optim_wrapper)
    runner.param_schedulers = runner.build_param_scheduler(runner.param_schedulers)
    ours, stock = tmp_path / "gcu", tmp_path / "stock"  # neither exists yet

    ours_peak = peak_python_memory(lambda: runner.save_checkpoint(str(ours), "iter_1.pth"))
    stock_peak = peak_python_memory(
        lambda: Runner.save_checkpoint(runner, str(stock), "iter_1.pth")
    )

    by_iter = dict(by_epoch=False, meta=dict(note="by iteration"), save_param_scheduler=False)
    runner.save_checkpoint(str(ours), "iter_2.pth", **by_iter)
    Runner.save_checkpoint(runner, str(stock), "iter_2.pth", **by_iter)

    assert sorted(os.listdir(ours)) == ["iter_1.pth", "iter_2.pth"]
    for name in ("iter_1.pth", "iter_2.pth"):
        written = torch.load(str(ours / name), map_location="cpu")
        expected = torch.load(str(stock / name), map_location="cpu")
        assert {"state_dict", "optimizer", "ema_state_dict"} <= set(written)
        assert ("param_schedulers" in written) == (name == "iter_1.pth")
        assert written["meta"].pop("time") and expected["meta"].pop("time")
        assert same(written, expected), name
    assert written["meta"]["note"] == "by iteration" and written["meta"]["iter"] == 1
    assert stock_peak > AddsWeights.nbytes > 8 * ours_peak, (stock_peak, ours_peak)


@pytest.mark.parametrize("asked", ["file_client_args", "backend_args"])
def test_a_checkpoint_for_another_backend_is_written_by_mmengine(build, tmp_path, asked):
    """Options that name a file backend (the deprecated file_client_args, or backend_args
    for another backend) keep mmengine's save, which writes through that backend."""
    runner = build()
    options = dict(file_client_args=dict(backend="local"))
    if asked == "backend_args":
        options = dict(backend_args=dict(backend="http"))
    written = []

    def stock_save(runner, out_dir, name, **kwargs):
        written.append(kwargs)
        open(os.path.join(out_dir, name), "wb").close()

    with mock.patch.object(Runner, "save_checkpoint", stock_save):
        runner.save_checkpoint(str(tmp_path), "iter_1.pth", save_optimizer=False, **options)
    assert len(written) == 1 and written[0][asked] == options[asked]
    assert written[0]["save_optimizer"] is False
    assert os.listdir(tmp_path) == ["iter_1.pth"]


def test_resume_without_last_checkpoint_takes_the_newest_complete_one(build):
    first = build()
    first.save_checkpoint(
        first.work_dir, "iter_2.pth", save_optimizer=False, save_param_scheduler=False
    )
    newest = os.path.join(first.work_dir, "iter_2.pth")

    runner = build(resume=True)
    runner.load_or_resume()

    said = run_log(runner)
    assert "mmgcu: --resume: " in said and f"newest complete checkpoint, {newest}" in said


def test_a_damaged_checkpoint_is_named_before_torch_reads_it(build):
    runner = build()
    path = os.path.join(runner.work_dir, "iter_2.pth")
    with open(path, "wb"):
        pass  # 0 bytes: a save that never wrote

    with pytest.raises(GCUError, match="iter_2.pth"):
        runner.load_checkpoint(path)


@pytest.mark.parametrize("method", ["train", "val", "test"])
def test_the_result_is_mmengines(build, method, monkeypatch):
    runner = build()
    result = object()
    monkeypatch.setattr(Runner, method, lambda self: result)

    assert getattr(runner, method)() is result


# -- what other classes may read of the runner ---------------------------------------------------


def test_no_gcu_class_reads_what_only_gcu_runner_has():
    """Hooks, loops and processors get a ``runner`` that may be mmengine's own (a stock tool
    ignores ``runner_type``): they read only what every Runner has, and get the rest given."""
    gcu_only = {"accelerator", "card", "counterparts", "strategy", "checkpoint_io", "guard"}
    assert not gcu_only & set(dir(Runner))
    found = []
    for folder, _, files in os.walk(os.path.join(REPO, "mmgcu")):
        for name in files:
            path = os.path.join(folder, name)
            if not name.endswith(".py") or path.endswith(os.path.join("engine", "runner.py")):
                continue
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read())
            found += [
                f"{os.path.relpath(path, REPO)}:{node.lineno}: {what}"
                for node in ast.walk(tree)
                for what in [_runner_read(node, gcu_only)]
                if what
            ]
    assert not found, found


def _is_runner(node) -> bool:
    """``runner`` or ``<anything>.runner`` (a hook keeps the runner it was given)."""
    return (isinstance(node, ast.Name) and node.id == "runner") or (
        isinstance(node, ast.Attribute) and node.attr == "runner"
    )


def _runner_read(node, names):
    """What ``node`` reads of a runner among ``names``: ``runner.X`` or
    ``getattr(runner, "X")``; else None."""
    if isinstance(node, ast.Attribute) and node.attr in names and _is_runner(node.value):
        return f"runner.{node.attr}"
    if (
        isinstance(node, ast.Call)
        and getattr(node.func, "id", None) in ("getattr", "hasattr")
        and len(node.args) >= 2
        and _is_runner(node.args[0])
        and isinstance(node.args[1], ast.Constant)
        and node.args[1].value in names
    ):
        return f"{node.func.id}(runner, {node.args[1].value!r})"
    return None


def test_the_runner_read_scan_sees_each_form():
    code = "runner.card\nself.runner.guard\ngetattr(runner, 'accelerator')\nrunner.iter\n"
    found = [_runner_read(n, {"card", "guard", "accelerator"}) for n in ast.walk(ast.parse(code))]
    assert sorted(f for f in found if f) == [
        "getattr(runner, 'accelerator')",
        "runner.card",
        "runner.guard",
    ]


def test_a_run_formats_its_config_once(build, tmp_path, monkeypatch):
    """mmengine formats the config (yapf) on each read: in __init__'s environment log,
    RuntimeInfoHook, dump_config and each checkpoint. GCURunner's is formatted once."""
    import mmengine.config.config as mm_config

    calls = []
    real = mm_config.FormatCode
    monkeypatch.setattr(mm_config, "FormatCode", lambda *a, **k: calls.append(1) or real(*a, **k))
    runner = build()
    runner.call_hook("before_run")
    runner.dump_config()
    runner.save_checkpoint(str(tmp_path), "iter_1.pth", save_optimizer=False)
    meta = torch.load(str(tmp_path / "iter_1.pth"), map_location="cpu")["meta"]
    assert meta["cfg"] == runner.cfg.pretty_text
    assert len(calls) == 1


@pytest.mark.parametrize("differs", [False, True], ids=["same", "differs"])
def test_rank_0_formats_the_config_for_every_rank(differs, tmp_path):
    """Every rank logs the config (mmengine's __init__): rank 0 formats it for the ranks
    whose config is the same as its own; a rank whose config differs formats its own."""
    from tests.sim.helpers import run_ranks

    script = os.path.join(os.path.dirname(__file__), "programs", "config_text.py")
    env = dict(MMGCU_SIMULATE=2, WORK_DIR=str(tmp_path))
    if differs:
        env.update(CONFIG_NOTE_RANK="1")
    ranks = run_ranks(script, **env)
    assert [r["rank"] for r in ranks] == [0, 1]
    assert all(r["plain"] for r in ranks), ranks  # mmengine's text
    if not differs:
        assert [r["formatted"] for r in ranks] == [1, 0], ranks
        assert ranks[0]["digest"] == ranks[1]["digest"]
    else:
        assert [r["formatted"] for r in ranks] == [1, 1], ranks
        assert ranks[0]["digest"] != ranks[1]["digest"]


def test_a_config_rank_0_cannot_format_stops_every_rank(tmp_path):
    """mmengine raises SyntaxError for a config it cannot format: rank 0 raises it after
    telling the other ranks, which format their own text and raise it too, instead of
    waiting for rank 0's text until rank 0 exits (under srun without --kill-on-bad-exit,
    until the collective times out: 30 min)."""
    from tests.sim.helpers import run_ranks

    script = os.path.join(os.path.dirname(__file__), "programs", "config_text.py")
    env = dict(MMGCU_SIMULATE=2, WORK_DIR=str(tmp_path), CONFIG_UNFORMATTABLE=1)
    ranks = run_ranks(script, timeout=120, **env)
    assert [r["rank"] for r in ranks] == [0, 1]
    assert all("Failed to format the config file" in r["error"] for r in ranks), ranks

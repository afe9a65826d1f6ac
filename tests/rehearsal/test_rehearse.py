"""``mmgcu rehearse`` end to end: stock train.py under torchrun on simulated cards, twice
(train, validate, save; resume), and the report it prints and writes."""

import importlib.util
import json
import os
import os.path as osp
import subprocess
import sys

import pytest

from tests.conftest import REPO, TORCH_1, clean_env
from tests.e2e.conftest import TINY
from tests.rehearsal.helpers import assert_tiny_model_passed_every_phase

pytestmark = [pytest.mark.e2e]
STOCK = "mmseg::{}"
GCU_KEYS = (
    'custom_imports = dict(imports=["mmgcu"], allow_failed_imports=False)\n'
    'runner_type = "GCURunner"\n'
)


def rehearse(tmp_path, config, *args, timeout=600, **env):
    """``mmgcu rehearse CONFIG --cards 2 ARGS`` in a fresh process, ``env`` added; (exit,
    output, report)."""
    work = str(tmp_path / "work")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mmgcu.cli",
            "rehearse",
            config,
            "--cards",
            "2",
            "--work-dir",
            work,
            *args,
        ],
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(tmp_path),
    )
    out = proc.stdout + proc.stderr
    path = osp.join(work, "rehearsal.json")
    assert osp.isfile(path), out[-5000:]
    with open(path) as f:
        return proc.returncode, out, json.load(f)


#: One image per card for the stock models: what these tests assert does not depend on the
#: batch, and a step of a stock model at the config's batch is most of a rehearsal's time.
ONE_IMAGE = ("--cfg-options", "train_dataloader.batch_size=1")


def stock_config(tmp_path, name, extra=""):
    """A stock mmseg config with the two keys mmgcu needs (as the README says)."""
    path = tmp_path / (osp.basename(name))
    path.write_text(f"_base_ = [{STOCK.format(name)!r}]\n{GCU_KEYS}{extra}")
    return str(path)


@pytest.mark.skipif(
    not TORCH_1,
    reason="on this leg tests/cli/test_walkthrough.py rehearses the same model, its "
    "pretrained checkpoint missing too, with the README's command line",
)
@pytest.mark.t20
@pytest.mark.long
def test_a_config_with_a_missing_local_checkpoint_passes_every_phase(tmp_path):
    options = [
        "model.backbone.init_cfg.type=Pretrained",
        "model.backbone.init_cfg.checkpoint=checkpoints/r18.pth",
    ]
    code, out, report = rehearse(tmp_path, TINY, "--cfg-options", *options)
    assert code == 0, out[-5000:]
    assert_tiny_model_passed_every_phase(report, out, "checkpoints/r18.pth")


@pytest.mark.skipif(not TORCH_1, reason="PSANet rehearses on the T20 stack's leg (torch 1.10)")
@pytest.mark.t20
@pytest.mark.long
def test_psanet_passes_and_names_the_path_of_its_mmcv_op(tmp_path):
    config = stock_config(tmp_path, "psanet/psanet_r50-d8_4xb4-80k_ade20k-512x512.py")
    code, out, report = rehearse(tmp_path, config, "--iters", "1", *ONE_IMAGE)
    assert code == 0, out[-5000:]
    assert report["summary"]["card_ops"] == [
        dict(
            op="PSAMask",
            path="GCUPSAMask: ordinary tensor ops on the card (one gather)",
            cpu=False,
            count=2,
        )
    ]
    assert "open-mmlab://resnet50_v1c" in " ".join(report["notes"])
    assert "mmcv op PSAMask x2: GCUPSAMask: ordinary tensor ops on the card" in out
    assert "ops on a CPU path (a host round trip per call): none" in out


@pytest.mark.t20
@pytest.mark.long
def test_a_stock_ade20k_model_on_t20_cards_one_graph_a_step_and_its_buckets(tmp_path):
    """Stock Segformer (ADE20K): with mmgcu one graph a step, none compiled after warm-up,
    validation within its shape buckets; without mmgcu's changes (gcu_whole_graph=False)
    the report names the stalls: the head's accuracy cuts the step and recompiles it."""
    config = stock_config(tmp_path, "segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512.py")
    code, out, report = rehearse(tmp_path, config, "--iters", "3", *ONE_IMAGE)
    assert code == 0, out[-5000:]
    graph = report["summary"]["graph"]
    assert (graph["train"]["runs_later"], graph["train"]["compiles_later"]) == (1, 0)
    assert 0 < graph["val"]["compiles"] < graph["val"]["input_shapes"]
    assert any(c.startswith("SegformerHead x1: acc_seg") for c in graph["changes"])
    assert "verdict: PASSED: launch it" in out

    code, out, report = rehearse(
        tmp_path, config, "--iters", "3", *ONE_IMAGE, "gcu_whole_graph=False"
    )
    assert code == 0, out[-5000:]
    graph = report["summary"]["graph"]
    assert graph["train"]["runs_later"] == 3  # two masked indexings in mmseg's accuracy()
    assert {c["caller"].split(":")[0] for c in graph["train"]["cuts"]} == {
        "mmseg/models/losses/accuracy.py"
    }
    assert graph["val"]["compiles"] >= graph["val"]["input_shapes"]  # IoUMetric on the card too
    assert graph["stalls"][0]["what"].startswith("a training step runs 3 graphs")
    assert graph["stalls"][-1]["cost"] == "validation compiles a graph per image size"
    assert "PASSED, BUT IT STALLS THE CARD" in out


@pytest.mark.skipif(
    importlib.util.find_spec("mmpretrain") is None,
    reason="no torchvision build matches torch 2.13, so mmpretrain cannot be imported on this leg",
)
@pytest.mark.t20
@pytest.mark.long
def test_the_shipped_dinov2_config_rehearses_on_t20_cards(tmp_path):
    config = "dinov2/upernet_dinov2-s14_8xgcu-80k_loveda-518x518.py"  # as 'mmgcu configs' names it
    code, out, report = rehearse(tmp_path, config, "--iters", "1", *ONE_IMAGE)
    assert code == 0, out[-5000:]
    assert [p["status"] for p in report["phases"]] == ["passed"] * 7, report["phases"]
    assert report["crop"] == [128, 128]
    (note,) = [n for n in report["notes"] if "random initialisation" in n]
    assert "vit-small-p14_dinov2-pre_3rdparty_20230426-5641ca5a.pth" in note
    assert report["summary"]["sync_bn"]["layers"] > 0


def tiny_model_gradients() -> int:
    """Bytes of the tiny model's trainable parameters, built here on the CPU."""
    from mmengine.config import Config
    from mmengine.registry import DefaultScope
    from mmseg.registry import MODELS
    from mmseg.utils import register_all_modules

    register_all_modules(init_default_scope=False)
    with DefaultScope.overwrite_default_scope("mmseg"):
        model = MODELS.build(Config.fromfile(TINY).model)
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


@pytest.mark.t20
def test_real_scale_measures_one_card_and_works_out_each_card_of_the_job(tmp_path):
    code, out, report = rehearse(tmp_path, TINY, "--scale", "real")  # --cards 2
    assert code == 0, out[-5000:]
    assert [p["status"] for p in report["phases"]] == ["passed"] * 7, report["phases"]
    assert (report["cards"], report["world"], report["iters"]) == (1, 2, 1)
    assert [c["card"] for c in report["summary"]["cards"]] == [0]
    figure = report["memory"]
    with open(osp.join(report["work_dir"], "rehearsal", "memory-rank0-train.json")) as f:
        facts = json.load(f)
    grads = tiny_model_gradients()
    assert facts["gradients"] == dict(float32=grads) and facts["world_size"] == 1
    # SGD with momentum: one buffer per parameter. The gradients stay after the step where
    # zero_grad zeroes them in place (torch 1.10's default); torch 2 frees them (set_to_none)
    held = grads if TORCH_1 else 0
    assert facts["first"]["state_bytes"] == grads and facts["first"]["gradients_held"] == held
    assert figure["steady"]["bytes"] == facts["first"]["peak_bytes"] + grads + held
    names = [(a["name"], a["bytes"]) for a in figure["additions"]]
    # the largest SyncBN input: the stem's at half the 64 px crop, 16 channels, 2 images
    largest = facts["sync_bn"]["largest"]
    assert facts["sync_bn"]["layers"] == 23
    assert (largest["shape"], largest["dtype"]) == ([2, 16, 32, 32], "float32")
    assert names == [
        ("DDP gradient buckets", grads),
        ("DDP construction", 2 * facts["weights_bytes"]),  # its broadcast: all the weights
        ("SyncBN across 2 ranks", 2 * 16 * 32 * 32 * 4),  # a float32 copy of that input
    ]
    steady = max(figure["steady"]["bytes"], report["summary"]["peak_bytes"])
    assert figure["total_bytes"] == steady + grads + names[2][1] and figure["fits"]
    assert "one card measured for a job of 2" in out
    assert "memory per card for 2 rank(s), 2 image(s) each" in out
    assert "resume at the config's crop 64x64" in out and "PASSED" in out


#: A hook that kills its own rank in the resume job, as the kernel's out-of-memory killer
#: kills a rank whose simulated card outgrows the host.
KILLER = """import os
import signal

from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class KilledByTheHost(Hook):
    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        if runner.cfg.get("resume"):
            os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.t20
def test_a_rank_the_host_kills_is_not_proven_here_and_never_the_cards_failure(tmp_path):
    (tmp_path / "killer.py").write_text(KILLER)
    config = tmp_path / "killed.py"
    config.write_text(
        f"_base_ = [{TINY!r}]\n"
        'custom_imports = dict(imports=["mmgcu", "killer"], allow_failed_imports=False)\n'
        'custom_hooks = [dict(type="KilledByTheHost")]\n'
    )
    path = os.pathsep.join([str(tmp_path), REPO])
    code, out, report = rehearse(tmp_path, str(config), "--scale", "real", PYTHONPATH=path)
    assert code == 1, out[-5000:]
    statuses = [(p["name"], p["status"]) for p in report["phases"]]
    assert statuses[-1] == ("resume", "failed") and statuses[-2] == ("val", "passed")
    assert "exitcode -9" in report["error"]["message"]
    verdict = out.split("  verdict: ", 1)[1].splitlines()
    assert verdict[0].startswith(
        "NOT PROVEN ON THIS HOST: a rank was killed for this host's memory in resume"
    )
    assert "this says nothing of the T20's card" in verdict[0]
    assert verdict[1] == "  proven: build, placement, wrap, train, save, val"
    assert verdict[2].startswith("  proven: per card for 2 rank(s), ") and "fits" in verdict[2]
    assert verdict[3:5] == [  # (the progress lines on stderr follow)
        "  not proven: resume",
        f"  finish on this host: mmgcu rehearse {config} --cards 2",
    ]
    assert report["finish"] == f"mmgcu rehearse {config} --cards 2"
    assert "FAILED" not in out and "fix: the simulated cards" not in out


@pytest.mark.skipif(
    TORCH_1, reason="an op with no card path rehearses on the main leg (torch_gcu 2.x)"
)
def test_an_op_with_no_card_path_is_named_with_its_fix(tmp_path):
    dcn = (
        "model = dict(backbone=dict(stage_with_dcn=(False, False, False, True), "
        "dcn=dict(type='DCNv2', deform_groups=1, fallback_on_stride=False)))\n"
    )
    config = stock_config(tmp_path, "fcn/fcn_r50-d8_4xb2-40k_cityscapes-512x1024.py", dcn)
    code, out, report = rehearse(tmp_path, config, "--hardware", "s60", "--iters", "1", *ONE_IMAGE)
    assert code == 1
    assert [(p["name"], p["status"]) for p in report["phases"]][2:5] == [
        ("wrap", "passed"),
        ("train", "failed"),
        ("save", "not run"),
    ]
    error = report["error"]
    assert "modulated_deformable_im2col_impl: implementation for device gcu:" in error["message"]
    assert "'modulated_deformable_im2col' has no kernel on a GCU card" in error["fix"]
    assert "ModulatedDeformConv2dPack x3" in error["fix"]
    assert "fix: mmcv's compiled op 'modulated_deformable_im2col'" in out and "FAILED" in out


def test_a_stock_config_without_mmgcus_keys_fails_as_the_launch_would(tmp_path):
    config = tmp_path / "stock.py"
    config.write_text(
        f"_base_ = [{STOCK.format('fcn/fcn_r50-d8_4xb2-40k_cityscapes-512x1024.py')!r}]\n"
    )
    code, out, report = rehearse(tmp_path, str(config))
    assert code == 1
    assert report["phases"] == [dict(name="build", status="failed", detail=None)]
    assert "would run on mmengine's own Runner" in report["error"]["message"]
    assert "error (build)" in out


@pytest.mark.skipif(TORCH_1, reason="S60 cards (torch_gcu 2.x) are the main leg's")
def test_seed_each_step_gives_an_s60_the_random_numbers_of_a_t20(tmp_path):
    """A T20 card draws a new seed after each step (torch_xla's step seed), so with dropout
    an S60's iteration 2 differs from a T20's; seeded as a T20 is, an S60's equals it. An
    S60 left alone trains what the plain CPU trains (tools/plain_cpu.py: one process, no
    simulator, no mmgcu)."""
    from mmgcu.rehearsal import rehearse as run
    from mmgcu.rehearsal.run import rehearsal_config

    losses = {}
    for hardware, seeded in (("t20", False), ("s60", False), ("s60", True)):
        report = run(
            TINY,
            cards=1,
            hardware=hardware,
            iters=2,
            cfg_options={"model.decode_head.dropout_ratio": 0.5},
            work_dir=str(tmp_path / f"{hardware}-{seeded}"),
            seed_each_step=seeded,
        )
        assert report["passed"], report.get("error")
        losses[hardware, seeded] = [e["loss"] for e in report["summary"]["losses"]][:2]
    t20 = losses["t20", False]
    assert losses["s60", False][0] == t20[0] and losses["s60", False][1] != t20[1]
    assert losses["s60", True] == t20
    config = rehearsal_config(str(tmp_path / "s60-False"), TINY)
    plain = subprocess.run(
        [
            sys.executable,
            osp.join(REPO, "tools", "plain_cpu.py"),
            str(config),
            str(tmp_path / "plain"),
            "2",
        ],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert plain.returncode == 0, plain.stderr[-3000:]
    cpu = json.loads(plain.stdout.strip().splitlines()[-1])["losses"]
    assert cpu == pytest.approx(losses["s60", False], rel=1e-6)

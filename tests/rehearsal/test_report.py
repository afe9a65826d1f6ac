"""The report: the first error of a job's log, the fix mmgcu knows, the phases in order."""

from mmgcu.rehearsal.report import first_error, fix_for, format_report, phases_of

NOTICE = "mmgcu: torch_gcu is SIMULATED (T20: the torch_gcu 1.x API, xla:N; 2 cards)"


def test_first_error_is_the_first_traceback_of_any_rank():
    log = "\n".join(
        [
            NOTICE,
            "11/26 - mmengine - INFO - mmgcu: SyncBN: 59 layer(s)",
            "[rank1]: Traceback (most recent call last):",
            '[rank1]:   File "train.py", line 104, in <module>',
            "[rank1]:     main()",
            "[rank1]: RuntimeError: modulated_deformable_im2col_impl: implementation for "
            "device xla:1 not found.",
            "[rank0]: Traceback (most recent call last):",
            "[rank0]: KeyError: 'second'",
        ]
    )
    assert first_error(log) == (
        "RuntimeError: modulated_deformable_im2col_impl: implementation for device xla:1 not found."
    )


def test_first_error_follows_the_rank_whose_traceback_comes_first():
    log = "\n".join(
        [
            "[rank1]: Traceback (most recent call last):",
            "[rank0]: 11/26 - mmengine - INFO - Iter(train) [1/2]",
            '[rank1]:   File "train.py", line 104, in <module>',
            "[rank1]: KeyError: 'mIoU'",
        ]
    )
    assert first_error(log) == "KeyError: 'mIoU'"
    unmarked = "\n".join(  # torch 1.10: two ranks' tracebacks, no prefixes
        [
            "Traceback (most recent call last):",
            '  File "train.py", line 104, in <module>',
            "Traceback (most recent call last):",
            "11/26 20:54:42 - mmengine - INFO - Checkpoints will be saved",
            '  File "train.py", line 104, in <module>',
            "IndexError: index 255 is out of bounds for dimension 0 with size 19",
        ]
    )
    assert first_error(unmarked).startswith("IndexError: index 255 is out of bounds")
    interleaved = "\n".join(  # torch 1.10: two ranks wrote the same traceback at once
        [
            "Traceback (most recent call last):",
            "Traceback (most recent call last):",
            "    label_weights = torch.stack([class_weight[cls] for cls in label",
            'IndexError  File "cross_entropy_loss.py", line 66, in <listcomp>',
            ": index 255 is out of bounds for dimension 0 with size 19",
            "    label_weights = torch.stack([class_weight[cls] for cls in label",
            "IndexError: index 255 is out of bounds for dimension 0 with size 19",
        ]
    )
    assert first_error(interleaved) == (
        "IndexError: index 255 is out of bounds for dimension 0 with size 19"
    )
    assert first_error("Traceback (most recent call last):\nKeyboardInterrupt\n") == (
        "KeyboardInterrupt"
    )
    warning = f"{NOTICE}\n\nUserWarning: something\nmmgcu: the watchdog says hi\n"
    assert first_error(warning) is None


def test_first_error_takes_mmgcus_own_message_in_place_of_a_traceback():
    gcu_error = f"{NOTICE}\n\nmmgcu: 12 processes, one per card, but this node has 8\n"
    assert first_error(gcu_error) == "mmgcu: 12 processes, one per card, but this node has 8"
    prefixed = f"{NOTICE}\n\n[rank1]: mmgcu: card 0 of vm is in use by another running job\n"
    assert first_error(prefixed) == "mmgcu: card 0 of vm is in use by another running job"
    collective = (
        f"{NOTICE}\n\nRuntimeError: ProcessGroupGloo::allreduce: unsupported device type xla\n"
        "mmgcu: mmdet/utils/dist_utils.py:20 (reduce_mean) calls torch.distributed's ...\n"
        "mmgcu: rank 1 stops: rank 0 says why\n"
    )
    message = first_error(collective)
    assert message.startswith("RuntimeError: ProcessGroupGloo::allreduce")
    assert message.endswith("(reduce_mean) calls torch.distributed's ...")
    assert first_error(f"{NOTICE}\nall well\n") is None
    torchrun = (
        'Traceback (most recent call last):\n  File "run.py", line 723\n'
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
    )
    killed = first_error(f"{NOTICE}\n{torchrun}  exitcode  : -9 (pid: 7702)  (SIGKILL)\n")
    assert killed.startswith("a rank was killed by SIGKILL with no traceback (exitcode -9)")
    assert "fewer --cards" in fix_for(killed)


def test_fixes_name_the_op_and_its_layers():
    message = "RuntimeError: modulated_deformable_im2col_impl: implementation for device xla:1"
    ops = [
        dict(op="ModulatedDeformConv2dPack", path="mmcv's compiled op: no card kernel", count=13)
    ]
    fix = fix_for(message + " not found.", ops)
    assert "'modulated_deformable_im2col' has no kernel on a GCU card (xla:1)" in fix
    assert "ModulatedDeformConv2dPack x13" in fix
    gloo = fix_for("ProcessGroupGloo::allreduce: unsupported device type xla")
    assert "allreduce on a gloo group" in gloo and "gloo_eccl" in gloo
    assert fix_for("ZeroDivisionError: division by zero") is None


def rank(index, stage_iters=2, resumed_from=None, **extra):
    phases = [dict(name=n) for n in ("build", "val", "train", "end")]
    return dict(
        rank=index,
        card=index,
        api="gcu1",
        phases=phases,
        param_devices=[f"xla:{index}"],
        wrapper="GCU1DistributedDataParallel",
        wrapped=True,
        iterations=[
            dict(iter=i + 1, host_reads=1, graph_runs=1, seconds=0.5) for i in range(stage_iters)
        ],
        resumed_from=resumed_from,
        **extra,
    )


def test_phases_stop_at_the_first_failure(tmp_path):
    checkpoint = tmp_path / "iter_2.pth"
    checkpoint.write_bytes(b"x")
    train = {0: rank(0), 1: rank(1)}
    resume = {0: rank(0, 1, 2), 1: rank(1, 1, 2)}
    phases = phases_of(train, resume, 2, 2, "xla", str(checkpoint))
    assert [p["status"] for p in phases] == ["passed"] * 7
    misplaced = {0: rank(0), 1: dict(rank(1), param_devices=["cpu"])}
    phases = phases_of(misplaced, {}, 2, 2, "xla", str(checkpoint))
    assert [(p["name"], p["status"]) for p in phases][:3] == [
        ("build", "passed"),
        ("placement", "failed"),
        ("wrap", "not run"),
    ]
    short = {0: rank(0, 1), 1: rank(1, 1)}
    statuses = [p["status"] for p in phases_of(short, {}, 2, 2, "xla", None)]
    assert statuses == ["passed"] * 3 + ["failed"] + ["not run"] * 3
    unwrapped = {0: dict(rank(0), wrapped=False), 1: dict(rank(1), wrapped=False)}
    phases = phases_of(unwrapped, {}, 2, 2, "xla", str(checkpoint))
    assert phases[2] == dict(name="wrap", status="failed", detail="GCU1DistributedDataParallel")


def test_a_config_without_validation_skips_it(tmp_path):
    checkpoint = tmp_path / "iter_2.pth"
    checkpoint.write_bytes(b"x")
    train = {r: dict(rank(r), phases=[dict(name="build"), dict(name="train")]) for r in (0, 1)}
    resume = {0: rank(0, 1, 2), 1: rank(1, 1, 2)}
    phases = phases_of(train, resume, 2, 2, "xla", str(checkpoint), has_val=False)
    assert [(p["name"], p["status"]) for p in phases][4:] == [
        ("save", "passed"),
        ("val", "skipped"),
        ("resume", "passed"),
    ]


def test_the_text_names_each_phase_and_the_verdict():
    phases = [dict(name=n, status="passed", detail=None) for n in ("build", "train")]
    text = format_report(
        dict(
            config="c.py",
            cards=2,
            hardware="T20",
            api="gcu1",
            torch="1.10.2",
            iters=2,
            scale="small",
            crop=[128, 128],
            config_crop=[512, 512],
            notes=["pretrained weights not found locally"],
            phases=phases + [dict(name="val", status="failed", detail=None)],
            error=dict(phase="val", message="KeyError: 'mIoU'", fix=None),
            summary={},
            json="r.json",
            logs=["train.log"],
            passed=False,
        )
    )
    assert "note: pretrained weights not found locally" in text
    assert "  val        failed" in text and "error (val): KeyError: 'mIoU'" in text
    assert text.endswith("FAILED: fix the error above before the T20 sees this config")

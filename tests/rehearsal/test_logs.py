"""A job's log: its first error, whichever rank wrote it, and the fix mmgcu knows."""

from mmgcu.rehearsal.logs import first_error, fix_for

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


def test_a_missing_model_library_gets_the_fix_of_the_stack_the_jobs_ran_on():
    t20 = fix_for("ModuleNotFoundError: No module named 'torchvision'", torch="1.10.2")
    assert "this environment lacks torchvision" in t20
    assert "tools/install_t20.sh PYTHON installs mmpretrain 1.2.0" in t20
    assert "0.11.3" in t20 and "torch 2.13" not in t20
    main = fix_for("ModuleNotFoundError: No module named 'mmpretrain'", torch="2.13.0")
    assert "lacks mmpretrain" in main and "no torchvision build matches torch 2.13" in main
    assert "on the T20 stack" in main and "install_t20.sh" not in main
    other = fix_for("No module named 'torchvision'", torch="2.5.1")
    assert "torchvision release built for torch 2.5.1" in other
    # mmdet needs no torchvision: it installs on either stack, with --mmdet on the T20's
    mmdet = fix_for("No module named 'mmdet'", torch="2.13.0")
    assert "requirements/zoo.txt" in mmdet and "T20 stack" not in mmdet
    assert "install_t20.sh PYTHON --mmdet" in fix_for("No module named 'mmdet.models'")

"""Test (and evaluate) an mmseg model: mmseg's tools/test.py, honouring ``runner_type``.

mmseg 1.2.2's own tools/test.py builds ``Runner.from_cfg(cfg)`` whatever the config's
``runner_type`` says (its train.py does honour it), so on a GCU it would run stock
mmengine's CUDA set-up. This module takes the same arguments and builds the runner the
way mmseg's train.py does. It ships in the package, so ``mmgcu test`` (and
``tools/dist_test.sh``, ``tools/test.py``) run it under torchrun from a wheel too.

    python -m mmgcu.cli.test_entry CONFIG CHECKPOINT [--work-dir W] [--out DIR]
        [--show-dir DIR] [--tta] [--cfg-options k=v ...] [--launcher none|pytorch|slurm|mpi]
"""

import argparse
import os
import os.path as osp

from mmengine.config import Config, DictAction
from mmengine.registry import RUNNERS
from mmengine.runner import Runner


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="MMSeg test (and eval) a model on GCUs")
    parser.add_argument("config", help="config file path")
    parser.add_argument("checkpoint", help="checkpoint file")
    parser.add_argument("--work-dir", help="where the evaluation results are dumped")
    parser.add_argument("--out", help="directory for predictions, for offline evaluation")
    parser.add_argument("--show", action="store_true", help="show prediction results")
    parser.add_argument("--show-dir", help="directory where painted images are saved")
    parser.add_argument("--wait-time", type=float, default=2, help="interval of --show (s)")
    parser.add_argument(
        "--cfg-options",
        nargs="+",
        action=DictAction,
        help="override config settings, key=value (as in mmseg's tools)",
    )
    parser.add_argument("--launcher", choices=["none", "pytorch", "slurm", "mpi"], default="none")
    parser.add_argument("--tta", action="store_true", help="test time augmentation")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=0)
    args = parser.parse_args(argv)
    os.environ.setdefault("LOCAL_RANK", str(args.local_rank))
    return args


def _show(cfg, args):
    hooks = cfg.default_hooks
    if "visualization" not in hooks:
        raise RuntimeError("--show/--show-dir need default_hooks.visualization")
    hooks.visualization.draw = True
    if args.show:
        hooks.visualization.show = True
        hooks.visualization.wait_time = args.wait_time
    if args.show_dir:
        cfg.visualizer.save_dir = args.show_dir


def build_config(args) -> Config:
    cfg = Config.fromfile(args.config)
    cfg.launcher = args.launcher
    if args.cfg_options is not None:
        cfg.merge_from_dict(args.cfg_options)
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get("work_dir") is None:
        cfg.work_dir = osp.join("./work_dirs", osp.splitext(osp.basename(args.config))[0])
    cfg.load_from = args.checkpoint
    if args.show or args.show_dir:
        _show(cfg, args)
    if args.tta:
        cfg.test_dataloader.dataset.pipeline = cfg.tta_pipeline
        cfg.tta_model.module = cfg.model
        cfg.model = cfg.tta_model
    if args.out is not None:
        cfg.test_evaluator["output_dir"] = args.out
        cfg.test_evaluator["keep_results"] = True
    return cfg


def main(argv=None) -> None:
    cfg = build_config(parse_args(argv))
    runner = RUNNERS.build(cfg) if "runner_type" in cfg else Runner.from_cfg(cfg)
    runner.test()


if __name__ == "__main__":
    main()

"""mmseg's model zoo, one stock config per family, rehearsed on 2 simulated cards per leg.

    python tools/zoo.py run --leg main|t20 --out zoo_results/LEG.json [--only FAMILY,...]
    python tools/zoo.py plain --out zoo_results/LEG.json --other zoo_results/OTHER.json
    python tools/zoo.py table zoo_results/main.json zoo_results/t20.json --out docs/zoo.md

``run`` rehearses each family (:func:`mmgcu.rehearsal.rehearse`, ``--scale small``, 3
iterations, validation, checkpoint, resume) with this leg's python: the main leg (torch 2.x)
on simulated S60 cards (torch_gcu 2.x), the T20 leg (Python 3.8, torch 1.10) on simulated T20
cards (torch_gcu 1.x). Each config is mmseg's own, with the two keys mmgcu needs added in a
config of one line (as a user does). Results are written after every family. ``table``
writes the markdown table of both legs. ``plain`` trains, with this leg's python, the
rehearsal config of each family whose losses differ between the legs on the plain CPU
(``tools/plain_cpu.py``), so that the table tells the torch builds' own difference from
mmgcu's (``make zoo`` runs them all).
"""

import argparse
import glob
import json
import os
import os.path as osp
import re
import sys
import time
from typing import Dict, Iterable, List, Optional, Tuple

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from mmgcu.rehearsal.graphs import WARM_UP  # noqa: E402

#: family -> (stock config under mmseg's configs/, package it needs beyond mmseg or None).
#: The smallest config of each family; where a family's smallest trains on a dataset of
#: another task (LEVIR-CD's image pairs for Swin), the ADE20K one.
FAMILIES = {
    "ann": ("ann/ann_r50-d8_4xb4-80k_ade20k-512x512.py", None),
    "apcnet": ("apcnet/apcnet_r50-d8_4xb4-80k_ade20k-512x512.py", None),
    "beit": ("beit/beit-base_upernet_8xb2-160k_ade20k-640x640.py", None),
    "bisenetv1": ("bisenetv1/bisenetv1_r18-d32_4xb4-160k_cityscapes-1024x1024.py", None),
    "bisenetv2": ("bisenetv2/bisenetv2_fcn_4xb4-amp-160k_cityscapes-1024x1024.py", None),
    "ccnet": ("ccnet/ccnet_r50-d8_4xb4-80k_ade20k-512x512.py", None),
    "cgnet": ("cgnet/cgnet_fcn_4xb4-60k_cityscapes-680x680.py", None),
    "convnext": ("convnext/convnext-tiny_upernet_8xb2-amp-160k_ade20k-512x512.py", "mmpretrain"),
    "danet": ("danet/danet_r50-d8_4xb4-80k_ade20k-512x512.py", None),
    "ddrnet": ("ddrnet/ddrnet_23-slim_in1k-pre_2xb6-120k_cityscapes-1024x1024.py", None),
    "deeplabv3": ("deeplabv3/deeplabv3_r50-d8_4xb4-80k_ade20k-512x512.py", None),
    "deeplabv3plus": ("deeplabv3plus/deeplabv3plus_r18-d8_4xb4-80k_isaid-896x896.py", None),
    "dmnet": ("dmnet/dmnet_r50-d8_4xb4-80k_ade20k-512x512.py", None),
    "dnlnet": ("dnlnet/dnl_r50-d8_4xb4-80k_ade20k-512x512.py", None),
    "dpt": ("dpt/dpt_vit-b16_8xb2-160k_ade20k-512x512.py", None),
    "emanet": ("emanet/emanet_r50-d8_4xb2-80k_cityscapes-769x769.py", None),
    "encnet": ("encnet/encnet_r50-d8_4xb4-80k_ade20k-512x512.py", None),
    "erfnet": ("erfnet/erfnet_fcn_4xb4-160k_cityscapes-512x1024.py", None),
    "fastfcn": ("fastfcn/fastfcn_r50-d32_jpu_psp_4xb4-80k_ade20k-512x512.py", None),
    "fastscnn": ("fastscnn/fast_scnn_8xb4-160k_cityscapes-512x1024.py", None),
    "fcn": ("fcn/fcn_r50-d8_4xb4-80k_ade20k-512x512.py", None),
    "gcnet": ("gcnet/gcnet_r50-d8_4xb4-80k_ade20k-512x512.py", None),
    "hrnet": ("hrnet/fcn_hr18_4xb4-80k_isaid-896x896.py", None),
    "icnet": ("icnet/icnet_r18-d8_4xb2-80k_cityscapes-832x832.py", None),
    "isanet": ("isanet/isanet_r50-d8_4xb4-80k_ade20k-512x512.py", None),
    "knet": ("knet/knet-s3_r50-d8_fcn_8xb2-adamw-80k_ade20k-512x512.py", None),
    "mae": ("mae/mae-base_upernet_8xb2-amp-160k_ade20k-512x512.py", None),
    "mask2former": ("mask2former/mask2former_r50_8xb2-160k_ade20k-512x512.py", "mmdet"),
    "maskformer": ("maskformer/maskformer_r50-d32_8xb2-160k_ade20k-512x512.py", "mmdet"),
    "mobilenet_v2": ("mobilenet_v2/mobilenet-v2-d8_fcn_4xb4-160k_ade20k-512x512.py", None),
    "mobilenet_v3": ("mobilenet_v3/mobilenet-v3-d8_lraspp_4xb4-320k_cityscapes-512x1024.py", None),
    "nonlocal_net": ("nonlocal_net/nonlocal_r50-d8_4xb4-80k_ade20k-512x512.py", None),
    "ocrnet": ("ocrnet/ocrnet_hr18_4xb4-80k_ade20k-512x512.py", None),
    "pidnet": ("pidnet/pidnet-s_2xb6-120k_1024x1024-cityscapes.py", None),
    "point_rend": ("point_rend/pointrend_r50_4xb4-160k_ade20k-512x512.py", None),
    "poolformer": ("poolformer/fpn_poolformer_s12_8xb4-40k_ade20k-512x512.py", "mmpretrain"),
    "psanet": ("psanet/psanet_r50-d8_4xb4-80k_ade20k-512x512.py", None),
    "pspnet": ("pspnet/pspnet_r18-d8_4xb4-80k_isaid-896x896.py", None),
    "resnest": ("resnest/resnest_s101-d8_fcn_4xb4-160k_ade20k-512x512.py", None),
    "san": ("san/san-vit-b16_voc12aug-640x640.py", None),
    "segformer": ("segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512.py", None),
    "segmenter": ("segmenter/segmenter_vit-s_fcn_8xb1-160k_ade20k-512x512.py", None),
    "segnext": ("segnext/segnext_mscan-t_1xb16-adamw-160k_ade20k-512x512.py", None),
    "sem_fpn": ("sem_fpn/fpn_r50_4xb4-160k_ade20k-512x512.py", None),
    "setr": ("setr/setr_vit-l-mla_8xb1-160k_ade20k-512x512.py", None),
    "stdc": ("stdc/stdc1_4xb12-80k_cityscapes-512x1024.py", None),
    "swin": ("swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py", None),
    "twins": ("twins/twins_svt-s_uperhead_8xb2-160k_ade20k-512x512.py", None),
    "unet": ("unet/unet-s5-d16_fcn_4xb4-40k_drive-64x64.py", None),
    "upernet": ("upernet/upernet_r50_4xb4-80k_ade20k-512x512.py", None),
    "vit": ("vit/vit_deit-s16_upernet_8xb2-80k_ade20k-512x512.py", None),
}
#: What the zoo changes in a family's config to fit this 2-core, 24 GiB host, and why
#: (family -> ({option: value}, why)); at the small crop every family fits as it is.
OPTIONS: Dict[str, Tuple[Dict[str, object], str]] = {}
#: The project's own config for the field reports' backbone (T20 stack: mmpretrain).
DINOV2 = ("dinov2", "configs/dinov2/upernet_dinov2-s14_8xgcu-80k_loveda-518x518.py", "mmpretrain")
#: Families left out of the zoo, and why (not a fault of mmgcu's or a card's).
LEFT_OUT = {
    "vpd": "depth estimation (NYU depth maps, not class masks) on Stable Diffusion's UNet, "
    "which needs the ldm package and its weights",
    "dsdl": "a dataset description format (configs for VOC and Cityscapes), not a model family",
}
#: Failures whose cause lies outside mmgcu, checked without it (the same error from stock
#: mmseg on the CPU) or in the vendor's source: family -> (text of the error, where, why).
CLASS_WEIGHT = (
    "index 255 is out of bounds",
    "fails in mmseg",
    "mmseg 1.2.2's CrossEntropyLoss with class_weight (as this config sets) indexes the "
    "weights with every label, the ignore index 255 included (losses/cross_entropy_loss.py, "
    "line 66): the same IndexError from that loss alone on the CPU, for any label map with "
    "ignored pixels, as Cityscapes' have",
)
UPSTREAM = {
    "cgnet": CLASS_WEIGHT,
    "pidnet": CLASS_WEIGHT,
    "san": (
        "has no attribute 'init_weights'",
        "fails in mmseg",
        "mmseg 1.2.2's SAN head cannot initialise without its CLIP checkpoint: with no "
        "'Pretrained_Part' weights, RecWithAttnbias.init_weights calls super().init_weights(), "
        "which nn.Module lacks (san_head.py, line 368); the same AttributeError building the "
        "model on the CPU and calling init_weights, and the zoo downloads nothing",
    ),
}
WHY_NOT_HERE = {
    "mmpretrain": "mmpretrain is not importable in this environment (it imports torchvision; "
    "no torchvision build matches this torch)",
    "mmdet": "mmdet is not importable in this environment (make zoo installs it: "
    "requirements/zoo.txt)",
}
LEGS = {
    "main": ("s60", "S60: torch_gcu 2.x, torch 2.13"),
    "t20": ("t20", "T20: torch_gcu 1.x, torch 1.10, Python 3.8"),
}
#: Iterations per rehearsal: the two of warm-up (:data:`mmgcu.rehearsal.graphs.WARM_UP`) and
#: one after, whose graph runs and compiles the T20 leg's graph table shows.
ITERS = 3
GCU_KEYS = (
    'custom_imports = dict(imports=["mmgcu"], allow_failed_imports=False)\n'
    'runner_type = "GCURunner"\n'
)


def user_config(folder: str, family: str, stock: str) -> str:
    """mmseg's config with the two keys mmgcu needs, as a user's config of its own."""
    path = osp.join(folder, f"{family}.py")
    with open(path, "w") as f:
        f.write(f"_base_ = [{'mmseg::' + stock!r}]\n{GCU_KEYS}")
    return path


def importable(package: str) -> bool:
    try:
        __import__(package)
    except Exception:
        return False
    return True


def rehearse_family(family, config, needs, leg, work_root) -> dict:
    from mmgcu.rehearsal import rehearse
    from mmgcu.rehearsal.run import rehearsal_config

    row = dict(family=family, config=config, needs=needs)
    if needs and not importable(needs):
        return dict(row, result="not run", reason=WHY_NOT_HERE[needs])
    if config.startswith("configs/"):  # one of mmgcu's own configs
        config = osp.join(REPO, config)
    else:
        config = user_config(work_root, family, config)
    start = time.time()
    options, why = OPTIONS.get(family, (None, None))
    if why:
        row["changed"] = why
    report = rehearse(
        config,
        cfg_options=options,
        cards=2,
        hardware=LEGS[leg][0],
        iters=ITERS,
        scale="small",
        work_dir=osp.join(work_root, family),
        seed_each_step=True,  # S60's cards draw the random numbers a T20's draw
    )
    for ckpt in glob.glob(osp.join(work_root, family, "*.pth")):
        os.remove(ckpt)  # ViT-L's are GBs; the row keeps what the table needs
    summary = report.get("summary") or {}
    error = report.get("error") or {}
    return dict(
        row,
        result="passed" if report["passed"] else "failed",
        phase=error.get("phase"),
        reason=error.get("message"),
        fix=error.get("fix"),
        losses=[e.get("loss") for e in summary.get("losses", [])],
        seconds=round(time.time() - start, 1),
        crop=report.get("crop"),
        peak_gib=round(summary.get("peak_bytes", 0) / (1 << 30), 2),
        amp=summary.get("amp"),
        card_ops=summary.get("card_ops", []),
        graph=graph_row(summary.get("graph")),
        rehearsal_config=rehearsal_config(report["work_dir"], report["config"]),
    )


def graph_row(graph) -> dict:
    """What the table shows of a lazy card's graphs (None off a lazy card)."""
    if not graph:
        return None
    train, val = graph.get("train") or {}, graph.get("val") or {}
    cuts = [f"{c['what']} ({c['cause']}) at {c['caller']}" for c in train.get("cuts", ())[:3]]
    return dict(
        runs_first=train.get("runs_first"),
        runs_later=train.get("runs_later"),
        compiles_later=train.get("compiles_later"),
        val_compiles=val.get("compiles"),
        val_images=val.get("images"),
        val_shapes=val.get("input_shapes"),
        val_runs_per_image=val.get("runs_per_image"),
        cuts=cuts,
        val_cuts=[f"{c['what']} ({c['cause']}) at {c['caller']}" for c in val.get("cuts", ())[:3]],
        changes=graph.get("changes", []),
        stalls=[s["what"] for s in graph.get("stalls", ())],
    )


def run_stamp() -> str:
    """When and from which commit a generated table's figures come: the date (UTC) and the
    checkout's commit, marked where tracked files differ from it."""
    import subprocess

    def git(*args):
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
        return done.stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    if git("status", "--porcelain", "--untracked-files=no"):
        commit += " with uncommitted changes"
    return f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, commit {commit}"


def run(args) -> int:
    out = osp.abspath(args.out)
    os.makedirs(osp.dirname(out), exist_ok=True)
    work_root = osp.join(osp.dirname(out), f"work-{args.leg}")
    os.makedirs(work_root, exist_ok=True)
    todo = [(f, c, n) for f, (c, n) in FAMILIES.items()] + [DINOV2]
    order = [t[0] for t in todo]
    if args.only:
        todo = [t for t in todo if t[0] in args.only.split(",")]
    import torch

    results = dict(leg=args.leg, label=LEGS[args.leg][1], torch=torch.__version__, rows=[])
    results["run"] = run_stamp()
    results["repo"] = REPO  # table() writes the checkout's paths relative to it
    if args.only and osp.isfile(out):  # rerun some families: keep the others' rows
        with open(out) as f:
            kept = json.load(f)
        for row in kept["rows"]:
            row.setdefault("run", kept.get("run"))  # the run each kept row comes from
        results["rows"] = [r for r in kept["rows"] if r["family"] not in args.only.split(",")]
    for family, config, needs in todo:
        try:
            row = rehearse_family(family, config, needs, args.leg, work_root)
        except Exception as e:  # one family's trouble does not end the hour-long run
            row = dict(family=family, config=config, needs=needs, result="failed")
            row.update(phase="rehearse", reason=f"{type(e).__name__}: {e}", losses=[])
        row["run"] = results["run"]
        results["rows"].append(row)
        results["rows"].sort(key=lambda r: order.index(r["family"]))
        print(
            f"zoo {args.leg}: {family:<14} {row['result']:<8} {row.get('seconds', '')} s "
            f"{row.get('reason') or ''}"[:200],
            flush=True,
        )
        with open(out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


PLAIN = osp.join(REPO, "tools", "plain_cpu.py")


def uses_amp(rows) -> bool:
    """Whether a family's config trains with AMP, which each generation's autocast applies
    to its own list of ops."""
    return any(r.get("amp") or "amp" in r["config"] for r in rows)


def differ(row, peer) -> bool:
    """Whether two legs' float32 rows of a family both passed and their losses differ."""
    ran = [r for r in (row, peer) if r and r["result"] == "passed" and r.get("losses")]
    return len(ran) == 2 and not uses_amp(ran) and not agree(row["losses"], peer["losses"])


def plain_losses(row) -> dict:
    """The row's rehearsal config trained on the plain CPU by this python
    (tools/plain_cpu.py), in its work dir: ``{'losses': [...]}`` or ``{'error': ...}``."""
    import subprocess

    config = row["rehearsal_config"]
    work_dir = osp.join(osp.dirname(osp.dirname(config)), "plain")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MMGCU_")}
    cmd = [sys.executable, PLAIN, config, work_dir, str(ITERS)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    last = (done.stdout.strip().splitlines() or [""])[-1]
    if done.returncode == 0 and last.startswith("{"):
        return json.loads(last)
    return dict(error=(done.stderr.strip().splitlines() or ["no output"])[-1][:300])


def plain(args) -> int:
    """Each row of ``--out`` whose losses differ from ``--other``'s gets the plain CPU's."""
    with open(args.out) as f:
        results = json.load(f)
    with open(args.other) as f:
        others = {r["family"]: r for r in json.load(f)["rows"]}
    import torch

    for row in results["rows"]:
        row.pop("plain", None)
        if differ(row, others.get(row["family"])):
            row["plain"] = dict(plain_losses(row), torch=torch.__version__)
            print(f"zoo {results['leg']}: {row['family']:<14} plain CPU {row['plain']}", flush=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    return 0


def agreement(rows) -> str:
    """The table's last cell: whether the first two legs' losses agree, and where float32
    rows differ, whether the torch builds differ on the plain CPU too."""
    ran = [r for r in rows if r and r["result"] == "passed"]
    if len(ran) < 2:
        return "-"
    losses = [r["losses"] for r in ran[:2]]
    if agree(*losses):
        return "yes"
    if uses_amp(ran):
        return "within 1e-2 (AMP)" if agree(*losses, rel=1e-2) else "**no** (AMP)"
    cpu = [(r.get("plain") or {}).get("losses") for r in ran[:2]]
    if None in cpu:
        return "**no**"
    if agree(*cpu):
        return f"**no**; the plain CPU agrees: {_losses(dict(losses=cpu[0]))}"
    return "no, nor the plain CPU: " + " ; ".join(_losses(dict(losses=c)) for c in cpu)


def upstream(row) -> Tuple[str, str]:
    """Where and why a failed row fails outside mmgcu, or ``('', '')``."""
    text, where, why = UPSTREAM.get(row["family"], ("", "", ""))
    return (where, why) if text and text in (row.get("reason") or "") else ("", "")


def _cell(row) -> str:
    if row is None:
        return "-"
    if row["result"] == "passed":
        return f"passed ({row['seconds']:.0f} s)"
    if row["result"] == "not run":
        return "not run"
    where = upstream(row)[0] or "**failed**"
    return f"{where} ({row['phase']})"


def _losses(row) -> str:
    if not row or not row.get("losses"):
        return "-"
    return " / ".join("-" if v is None else f"{v:.5f}" for v in row["losses"])


def agree(a, b, rel: float = 1e-4) -> bool:
    if not a or not b or None in a or None in b:
        return False
    return (
        bool(a and b)
        and len(a) == len(b)
        and all(abs(x - y) <= rel * max(abs(x), abs(y), 1e-12) for x, y in zip(a, b))
    )


def runs_of(leg: dict) -> str:
    """The runs a leg's rows come from: the run of most rows, then each other run with the
    families it re-ran."""
    by_run = {}
    for row in leg["rows"]:
        by_run.setdefault(row.get("run") or leg.get("run", "not recorded"), []).append(
            row["family"]
        )
    (most, _), *others = sorted(by_run.items(), key=lambda item: -len(item[1]))
    reruns = [f"{', '.join(families)} re-run {stamp}" for stamp, families in others]
    return " ".join([leg["leg"], most] + ([f"({'; '.join(reruns)})"] if reruns else []))


def table(args) -> int:
    legs = []
    for path in args.results:
        with open(path) as f:
            legs.append(json.load(f))
    by_leg = [{r["family"]: r for r in leg["rows"]} for leg in legs]
    families = list(dict.fromkeys(f for rows in by_leg for f in rows))
    lines = [
        "# The model zoo on simulated GCU cards",
        "",
        "Written by `make zoo` (`tools/zoo.py`): one stock mmseg 1.2.2 config per model family,",
        "with `custom_imports=['mmgcu']` and `runner_type='GCURunner'` added, rehearsed by",
        "`mmgcu rehearse` on 2 simulated cards per leg (`--scale small`: the largest crop side",
        "128 px, BEiT's and MAE's img_size with it; LRASPP's crop 392 x 392 px, the least its",
        "pooling window fits),",
        f"{ITERS} iterations, checkpoint, validation, resume and one more iteration (no second",
        "save);",
        "synthetic data through each config's own pipelines; no pretrained weights (none is",
        "downloaded).",
        f"Losses are those of iterations 1 to {ITERS} on rank 0, compared at 1e-4 (relative); in",
        "configs with AMP each leg halves the ops its own autocast lists (torch 2.13's for",
        "torch_gcu 2.x, torch 1.10's GPU policy for torch_gcu 1.x), with each torch's half",
        "kernels, so those are compared at 1e-2. A T20 card draws a new seed after each step",
        "(torch_xla's step seed); the S60 leg's cards are seeded the same way",
        "(`rehearse(seed_each_step=True)`), and a simulated card of either generation fills a",
        "tensor's random numbers in its logical order (docs/simulator.md), so that dropout draws",
        "the same numbers on both legs.",
        "Where a float32 row differs, `tools/plain_cpu.py` trains that leg's rehearsal config",
        f"{ITERS} iterations on the plain CPU (one process, no simulator, no mmgcu) with",
        "each leg's torch: 'no, nor the plain CPU' gives those losses, where the two torch",
        "builds differ too, without mmgcu.",
        "",
        "Runs: " + "; ".join(runs_of(leg) for leg in legs) + ".",
        "",
        "| family | config | "
        + " | ".join(leg["label"] for leg in legs)
        + " | losses "
        + " / ".join(leg["leg"] for leg in legs)
        + " | agree (1e-4) |",
        "|" + "---|" * (4 + len(legs)),
    ]
    problems = []
    for family in families:
        rows = [rows.get(family) for rows in by_leg]
        config = next(r["config"] for r in rows if r)
        losses = " ; ".join(_losses(r) for r in rows)
        cells = " | ".join(_cell(r) for r in rows)
        lines.append(f"| {family} | `{config}` | {cells} | {losses} | {agreement(rows)} |")
        for leg, row in zip(legs, rows):
            if row and row["result"] != "passed":
                problems.append(problem(family, leg, row))
    changed = [
        f"- **{r['family']}**: {r['changed']}"
        for rows in by_leg
        for r in rows.values()
        if r.get("changed")
    ]
    changed = list(dict.fromkeys(changed))
    lines += graph_table(legs, by_leg)
    lines += ["", "## Why a row did not pass", ""] + reason_lines(problems)
    lines += ["", "## What the zoo changed in a config", ""] + (changed or ["Nothing."])
    lines += ["", "## Families left out", ""]
    lines += [f"- **{family}**: {why}" for family, why in LEFT_OUT.items()]
    roots = [leg.get("repo") for leg in legs] + [REPO]
    with open(args.out, "w") as f:
        f.write(short_paths("\n".join(lines), roots) + "\n")
    print(f"zoo: wrote {args.out} ({len(families)} families)")
    return 0


#: A path up to and including its ``site-packages/`` (or ``dist-packages/``) folder.
SITE_PACKAGES = re.compile(r"[^\s'\"`(),;:]*[/\\]((?:site|dist)-packages)[/\\]")


def short_paths(text: str, roots: Iterable[Optional[str]] = ()) -> str:
    """``text`` without a machine's paths: an installed package's files from its
    ``site-packages/``, the files of a checkout (``roots``) relative to it, the home folder
    as ``~``."""
    text = SITE_PACKAGES.sub(r"\1/", text)
    for root in sorted({r.rstrip("/\\") for r in roots if r}, key=len, reverse=True):
        text = text.replace(root + os.sep, "") if root else text
    home = osp.expanduser("~")
    if home not in ("", "/", "~"):
        text = text.replace(home.rstrip("/\\") + os.sep, "~" + os.sep)
    return text


def problem(family: str, leg: dict, row: dict) -> Tuple[str, str, str, str]:
    """``(family, leg, what happened, why)`` of a row that did not pass; ``why`` is the
    paragraph that rows of other families or legs may share ('' when there is none)."""
    name = leg["label"].split(":")[0]
    if row["result"] == "not run":
        return family, name, "not run", row.get("reason") or ""
    where, why = upstream(row)
    if why:
        note = f"Outside mmgcu ({where}): {why}."
    else:
        note = f"Fix: {row['fix']}" if row.get("fix") else ""
    return family, name, row.get("reason") or "", note


def reason_lines(problems: List[Tuple[str, str, str, str]]) -> List[str]:
    """One item per family and error (its legs together), and each shared paragraph once,
    numbered, which the items refer to."""
    if not problems:
        return ["Every row passed."]
    merged: Dict[Tuple[str, str, str], List[str]] = {}
    for family, leg, what, why in problems:
        merged.setdefault((family, what, why), []).append(leg)
    notes: List[str] = list(dict.fromkeys(why for _, _, why in merged if why))
    lines = []
    for (family, what, why), names in merged.items():
        item = f"- **{family}**, {' and '.join(names)}: " + "\n  ".join(what.splitlines())
        lines.append(item + (f" (note {notes.index(why) + 1})" if why else ""))
    if notes:
        lines += ["", "Notes:", ""] + [f"{n}. {note}" for n, note in enumerate(notes, 1)]
    return lines


def graph_table(legs, by_leg) -> list:
    """The lazy card's graphs per family, from each leg whose cards keep one (the T20's)."""
    lines = []
    for leg, rows in zip(legs, by_leg):
        rows = [r for r in rows.values() if r.get("graph")]
        if not rows:
            continue
        lines += [
            "",
            f"## The lazy graph, {leg['label']}",
            "",
            "What the simulated XLA card counted (`mmgcu/sim/csrc/lazy_graph.h`, checked against",
            "torch_xla by `make conformance`): graph runs per training step after the "
            f"{WARM_UP} steps of",
            "warm-up (1 is the target: the step's own), graphs compiled after warm-up (0 is the",
            "target), and the validation's compiles for its images and input shapes. The extra",
            "runs name the op and the Python line that cut the graph.",
            "",
            "| family | runs per step | compiles after warm-up | validation: compiles / images "
            "/ shapes | runs per image | extra runs |",
            "|---|---|---|---|---|---|",
        ]
        for r in rows:
            g = r["graph"]
            val = f"{g['val_compiles']} / {g['val_images']} / {g['val_shapes']}"
            cuts = "; ".join(g["cuts"] + [f"validation: {c}" for c in g["val_cuts"]]) or "-"
            lines.append(
                f"| {r['family']} | {g['runs_later']} | {g['compiles_later']} | {val} | "
                f"{g['val_runs_per_image']} | {cuts.replace('|', '/')} |"
            )
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="rehearse every family with this python")
    p.add_argument("--leg", choices=tuple(LEGS), required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--only", help="comma-separated families (their rows replace those in --out)")
    p.set_defaults(func=run)
    p = sub.add_parser("plain", help="the plain CPU's losses where two legs' losses differ")
    p.add_argument("--out", required=True, help="this leg's results (rows gain 'plain')")
    p.add_argument("--other", required=True, help="the other leg's results")
    p.set_defaults(func=plain)
    p = sub.add_parser("table", help="the markdown table of the legs' results")
    p.add_argument("results", nargs="+")
    p.add_argument("--out", required=True)
    p.set_defaults(func=table)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

"""Section 5, ``host_reads``: how often the training loop makes the host wait for the card.

A stock mmseg FCN config, ``mmseg::fcn/fcn_r18-d8_4xb2-80k_cityscapes-512x1024.py`` (its
model, losses, auxiliary head, SyncBN, optimizer and hooks; ``pretrained=None``), with the
two keys the README tells users to add (``custom_imports=['mmgcu']``,
``runner_type='GCURunner'``), on the synthetic dataset at 64x64 (64 images, ``crop_size``,
``num_classes=4``): 2 ranks under ``tools/dist_train.sh``, 30 iterations, logger interval
10, no checkpoint, no validation. (mmseg's R50-D8 FCN gives the same counts, as the model's
depth does not change what is logged, at about 2x the run time: R18-D8 keeps the section
at about 4 minutes on 2 cores.)

``host_reads_probe.py`` (a hook the runs import) reads the simulator's per-process counters
(host numbers) at ``before_train``, after every iteration and at ``after_train``: host reads
(``.item()``-style scalar reads and copies to the CPU; on a card each is a wait for the
card's queued work) and torch_gcu 1.x lazy graph runs.

The target is the steady state: the reads after the first logged interval (iterations
``interval + 1`` to the last), per iteration and rank: one per log line, ``1 / interval``.
The first interval's reads (DDP's bucket rebuild, the first log line) and ``after_train``'s
are reported apart, as one-time reads. Variants, on each simulated API
(``--host-reads-apis``): mmgcu as it is; ``gcu_defer_scalars=False`` (stock mmengine's
logging: one ``.item()`` per logged scalar per step, on the same simulated cards); and
``--amp`` (``AmpOptimWrapper``) with each ``overflow_step`` the generation offers: ``skip``
(torch's GradScaler, 2.x only: one read per step, informational) and ``zero`` (target: as
without AMP).
"""

import glob
import json
import os.path as osp
import shutil

from harness import HERE, REPO, log, train_only_lines

from mmgcu.device.gcu1 import GCU1Accelerator
from mmgcu.device.gcu2 import GCU2Accelerator

TITLE = "host reads"
FCN_CONFIG = "mmseg::fcn/fcn_r18-d8_4xb2-80k_cityscapes-512x1024.py"
RANKS = 2
#: Variants: (gcu_defer_scalars, AMP overflow_step), and which are held to the target.
VARIANTS = dict(mmgcu=(True, None), stock=(False, None), amp_skip=(True, "skip"),
                amp_zero=(True, "zero"))  # fmt: skip
TARGETED = ("mmgcu", "amp_zero")
#: The overflow steps each generation offers, as its accelerator says.
AMP_MODES = {a.kind: a.overflow_steps for a in (GCU2Accelerator, GCU1Accelerator)}
# 32 batches of 2: no epoch ends within a default run (30 iterations). Otherwise mmengine's
# LoggerHook also logs (and so reads the card) at the end of an epoch when the loader is no
# longer than the interval, which is not the log line the target counts.
TRAIN_IMAGES = 64
COUNTS = ("host_reads", "scalar_reads", "copies_to_host", "graph_runs", "optimizer_step", "unlazy")


def needs_simulator(args):
    return True


def config_lines(data_root, iters, log_interval, defer, amp=None):
    """The run's config: the stock mmseg FCN config plus the README's two keys, the
    synthetic dataset, a training-only schedule and the probe hook; ``amp``: the
    ``overflow_step`` of an ``AmpOptimWrapper`` (what ``tools/train.py --amp`` sets)."""
    dataset = (
        f"dict(_delete_=True, type='BaseSegDataset', data_root={data_root!r}, metainfo=dict("
        "classes=('background', 'red', 'green', 'blue'), palette=[[20, 20, 20], "
        "[200, 40, 40], [40, 200, 40], [40, 40, 200]]), img_suffix='.png', "
        "seg_map_suffix='.png', reduce_zero_label=False, data_prefix=dict("
        "img_path='img_dir/train', seg_map_path='ann_dir/train'), pipeline=["
        "dict(type='LoadImageFromFile'), dict(type='LoadAnnotations'), "
        "dict(type='RandomFlip', prob=0.5), dict(type='PackSegInputs')])"
    )
    lines = [
        f"_base_ = [{FCN_CONFIG!r}]",
        "custom_imports = dict(imports=['mmgcu', 'host_reads_probe'], allow_failed_imports=False)",
        "runner_type = 'GCURunner'",
        "crop_size = (64, 64)",
        "model = dict(pretrained=None, data_preprocessor=dict(size=crop_size), "
        "decode_head=dict(num_classes=4), auxiliary_head=dict(num_classes=4))",
        "train_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False, "
        f"dataset={dataset})",
        "custom_hooks = [dict(type='HostReadsProbeHook')]",
        "randomness = dict(seed=0)",
    ] + train_only_lines(iters, log_interval)
    if not defer:
        lines.append("gcu_defer_scalars = False  # stock mmengine: .item() per logged scalar")
    if amp:
        lines.append(
            "optim_wrapper = dict(type='AmpOptimWrapper', loss_scale='dynamic', "
            f"overflow_step={amp!r})"
        )
    return lines


def read_probes(work):
    probes = []
    for path in sorted(glob.glob(osp.join(work, "host_reads_rank*.json"))):
        with open(path) as f:
            probes.append(json.load(f))
    return probes


def variants(api):
    """The variants run on ``api``: both loggings, and AMP in each mode it offers."""
    return [v for v, (_, amp) in VARIANTS.items() if amp is None or amp in AMP_MODES[api]]


def _check_probes(probes, api, variant, iters, tree=REPO):
    if len(probes) != RANKS:
        raise RuntimeError(f"{len(probes)} probe report(s), expected one per rank ({RANKS})")
    hub = "MessageHub" if variant == "stock" else "CardMessageHub"
    for p in probes:
        where = p["after"]["mmgcu_file"]
        if p["iters"] != iters or p["after"]["api"] != api or p["message_hub"] != hub:
            raise RuntimeError(
                f"rank {p['rank']}: {p['iters']} iterations on {p['after']['api']} with "
                f"{p['message_hub']}, expected {iters} on {api} with {hub}"
            )
        if not where.startswith(osp.join(tree, "")):
            raise RuntimeError(f"rank {p['rank']} ran {where}, not this checkout's mmgcu")


def steady_state(probe, interval):
    """Reads after the first logged interval (its iterations and every later one, up to the
    last iteration's end), and the one-time reads around them: the first interval (DDP's
    bucket rebuild, placement checks, the first log line) and ``after_train``'s."""
    marks = probe["reads_by_iter"]
    start = probe["before"]["host_reads"]
    end = probe["after"]["host_reads"]
    steady_iters = len(marks) - interval
    if steady_iters <= 0:
        raise RuntimeError(f"{len(marks)} iterations leave no steady state after {interval}")
    return dict(
        iters=steady_iters,
        reads=marks[-1] - marks[interval - 1],
        first_interval=marks[interval - 1] - start,
        after_train=end - marks[-1],
    )


def summarize(probes, api, variant, iters, interval, tree=REPO):
    """Per-iteration counts averaged over iterations and ranks, with the per-rank totals,
    and the steady state after the first logged interval."""
    _check_probes(probes, api, variant, iters, tree)
    per_rank = [dict(rank=p["rank"], **{k: p["delta"][k] for k in COUNTS}) for p in probes]
    total_iters = sum(p["iters"] for p in probes)
    per_iter = {k: sum(r[k] for r in per_rank) / total_iters for k in COUNTS}
    steady = [dict(rank=p["rank"], **steady_state(p, interval)) for p in probes]
    steady_per_iter = sum(s["reads"] for s in steady) / sum(s["iters"] for s in steady)
    return dict(api=api, variant=variant, iters=iters, ranks=len(probes), per_rank=per_rank,
                per_iter=per_iter, steady=steady, steady_per_iter=steady_per_iter)  # fmt: skip


def _one(h, api, variant, cfg, iters, interval):
    name = f"host-reads-{api}-{variant}"
    work = h.work_dir(name)
    cmd = ["bash", osp.join(REPO, "tools", "dist_train.sh"), cfg, str(RANKS), "--work-dir", work]
    env = h.env(simulate=RANKS, api=api, paths=[HERE], PYTHON=h.python)
    code, wall, _, path = h.run(cmd, env, name)
    h.check(code, path, f"tools/dist_train.sh ({name})")
    result = summarize(read_probes(work), api, variant, iters, interval)
    result["process_s"] = wall
    shutil.rmtree(work, ignore_errors=True)
    return result


def run(h):
    a = h.args
    data = h.dataset(64, train=TRAIN_IMAGES, val=1)
    iters, interval = a.host_reads_iters, a.host_reads_interval
    out = dict(
        config=FCN_CONFIG,
        ranks=RANKS,
        iters=iters,
        log_interval=interval,
        what="card reads per iteration and rank after the first logged interval (steady "
        "state), the one-time reads around it, and lazy graph runs per iteration",
        target=f"mmgcu and AMP 'zero': 1/{interval} reads per iteration (one per log line)",
        apis={},
    )
    for api in a.host_reads_apis:
        out["apis"][api] = {}
        for variant in variants(api):
            defer, amp = VARIANTS[variant]
            lines = config_lines(data, iters, interval, defer, amp)
            cfg = h.write_config(f"host_reads_{variant}", lines)
            log(f"host_reads: {api}, {variant}, {RANKS} ranks, {iters} iterations")
            out["apis"][api][variant] = _one(h, api, variant, cfg, iters, interval)
        out["apis"][api]["passed"] = _passed(out["apis"][api], interval)
    out["passed"] = all(r["passed"] for r in out["apis"].values())
    return out


def _passed(api_result, interval):
    """One read per log line in steady state (a float tolerance only)."""
    return all(
        api_result[v]["steady_per_iter"] <= 1.0 / interval + 1e-9
        for v in TARGETED
        if v in api_result
    )


def one_time(r):
    first = "/".join(str(s["first_interval"]) for s in r["steady"])
    after = "/".join(str(s["after_train"]) for s in r["steady"])
    return f"{first} and {after}"


def _api_rows(api, r, interval):
    verdict = "PASS" if r["passed"] else "FAIL"
    target = f"{1 / interval:g} (one per log line)"
    m, s = r["mmgcu"], r["stock"]
    out = [
        (f"card reads / iteration after the first log interval, mmgcu [{api}]",
         m["steady_per_iter"], "reads", target, verdict),
        (f"  stock logging (gcu_defer_scalars=False) [{api}]", s["steady_per_iter"], "reads",
         "info", ""),
        (f"  one-time reads per rank, first interval and after_train, mmgcu [{api}]",
         one_time(m), "reads", "", ""),
        (f"  whole run (before_train..after_train), mmgcu / stock [{api}]",
         f"{m['per_iter']['host_reads']:.3f} / {s['per_iter']['host_reads']:.2f}", "reads", "",
         ""),
    ]  # fmt: skip
    for variant in ("amp_zero", "amp_skip"):
        if variant in r:
            mode = VARIANTS[variant][1]
            label = f"  --amp, overflow_step='{mode}', after the first log interval [{api}]"
            held = variant in TARGETED
            out.append((label, r[variant]["steady_per_iter"], "reads", target if held else "info",
                        verdict if held else ""))  # fmt: skip
    if api == "gcu1":
        runs = f"{m['per_iter']['graph_runs']:.2f} / {s['per_iter']['graph_runs']:.2f}"
        out.append((f"lazy graph runs / iteration, mmgcu / stock [{api}]", runs, "", "", ""))
    return out


def rows(result):
    out = []
    for api, r in result["apis"].items():
        out += _api_rows(api, r, result["log_interval"])
    return out

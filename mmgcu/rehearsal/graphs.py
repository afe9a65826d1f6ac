"""What a rehearsal says of the lazy graph of a T20 card (torch_gcu 1.x, an XLA device).

On such a card a training step should run one graph and, after warm-up, compile none; a
validation should compile a few graphs (one per shape bucket), not one per image size. The
rehearsal's ranks record what the simulated card did (:mod:`mmgcu.rehearsal.hook`: graph
runs by cause, compiles, the ops that fell back to the CPU and the Python line of each
extra cut); this module sums it up per step and per image, says whether the job stalls the
card and what fixes it.
"""

import statistics
from typing import Dict, List, Optional

#: Iterations that compile by design: the first step, and the second where the optimizer
#: made its state (momentum, Adam's moments) in the first and BatchNorm's counter became
#: data. After them a step compiles nothing when its shapes do not change.
WARM_UP = 2
#: Sizes a fixed test size is rounded up to (a stride-32 network's).
SIZE_STEP = 32


def _mean(values: List[float]) -> Optional[float]:
    return round(statistics.mean(values), 2) if values else None


def _merge_cuts(entries: List[dict], steps: int) -> List[dict]:
    """Each extra cut (cause, what, caller) with its runs and compiles per step."""
    merged: Dict[tuple, dict] = {}
    for entry in entries:
        for cut in entry.get("cuts", ()):
            key = (cut["cause"], cut["what"], cut["caller"])
            slot = merged.setdefault(key, dict(cause=key[0], what=key[1], caller=key[2], runs=0))
            slot["runs"] += cut["runs"]
    for slot in merged.values():
        slot["per_step"] = round(slot.pop("runs") / max(steps, 1), 2)
    return sorted(merged.values(), key=lambda c: -c["per_step"])


def train_figures(iterations: List[dict]) -> Optional[dict]:
    """Graph runs per step (first, after warm-up), compiles (warm-up, after), the extra
    cuts; None where the card is not lazy (no graph figures)."""
    if not iterations or "graph_runs" not in iterations[0]:
        return None
    later = iterations[WARM_UP:]
    return dict(
        steps=len(iterations),
        runs_first=iterations[0]["graph_runs"],
        runs_later=_mean([i["graph_runs"] for i in later]),
        compiles_warm_up=sum(i["compiles"] for i in iterations[:WARM_UP]),
        compiles_later=sum(i["compiles"] for i in later) if later else None,
        steps_later=len(later),
        cuts=_merge_cuts(later or iterations, len(later or iterations)),
    )


def val_figures(val: Optional[dict]) -> Optional[dict]:
    """Images, distinct input shapes, compiles and graph runs of a rank's validation."""
    if not val or "graph" not in val or "graph_runs" not in val["graph"]:
        return None
    graph, images = val["graph"], max(val.get("images") or 0, 1)
    shapes = [tuple(s) for s in val.get("input_shapes", ())]
    return dict(
        images=val.get("images") or 0,
        input_shapes=len(set(shapes)),
        largest=[max((s[0] for s in shapes), default=0), max((s[1] for s in shapes), default=0)],
        compiles=graph["compiles"],
        runs_per_image=round(graph["graph_runs"] / images, 2),
        cuts=_merge_cuts([graph], images),
    )


def stalls(train: Optional[dict], val: Optional[dict], factor: float) -> List[dict]:
    """What makes the job wait on the card, each ``{what, cost, fix}``."""
    found = []
    if train and train["runs_later"] is not None and train["runs_later"] > 1:
        where = "; ".join(f"{c['what']} at {c['caller']}" for c in train["cuts"][:3])
        found.append(
            dict(
                what=f"a training step runs {train['runs_later']} graphs ({where})",
                cost="each extra graph is a cut: the card stops, the host waits for it",
                fix=_cut_fix(train["cuts"]),
            )
        )
    if train and train["compiles_later"]:
        found.append(
            dict(
                what=f"{train['compiles_later']} graph(s) compiled in "
                f"{train['steps_later']} step(s) after warm-up",
                cost="every step recompiles (minutes each on a T20)",
                fix="keep the step's shapes fixed: a fixed crop (RandomCrop, the data "
                "preprocessor's size), drop_last=True, and no op whose output shape follows "
                "the data (the cuts above name them)",
            )
        )
    if val and val["runs_per_image"] > 1:
        where = "; ".join(f"{c['what']} at {c['caller']}" for c in val["cuts"][:3])
        found.append(
            dict(
                what=f"validation runs {val['runs_per_image']} graphs per image ({where})",
                cost="each is a cut, and those whose shapes follow the data compile anew",
                fix="compute the metric on the host: move the prediction to the CPU before "
                "it (mmgcu post-processes mmseg's predictions on the host unless "
                "gcu_whole_graph=False)",
            )
        )
    if val and val["input_shapes"] > 1 and val["compiles"] >= val["input_shapes"]:
        size = [-(-round(side / factor) // SIZE_STEP) * SIZE_STEP for side in val["largest"]]
        found.append(
            dict(
                what=f"validation compiled {val['compiles']} graphs for {val['images']} images "
                f"of {val['input_shapes']} input shapes",
                cost="validation compiles a graph per image size",
                fix="pad the inputs to one size: model.data_preprocessor.test_cfg = "
                f"dict(size=({size[0]}, {size[1]})) (the largest input here, at the "
                "config's scale)",
            )
        )
    return found


def _cut_fix(cuts: List[dict]) -> str:
    """What removes the extra cuts, by what makes them."""
    fixes = []
    for cut in cuts:
        if cut["cause"] == "host_read":
            fixes.append(f"do not read a card value in the step ({cut['caller']}: log the tensor)")
        elif cut["what"] in ("aten::nonzero", "aten::masked_select"):
            fixes.append(
                f"replace the indexing by a mask at {cut['caller']} with arithmetic on the mask "
                "((x * mask).sum() for x[mask].sum())"
            )
        else:
            fixes.append(f"{cut['what']} has no lowering on the card ({cut['caller']})")
    return "; ".join(dict.fromkeys(fixes))

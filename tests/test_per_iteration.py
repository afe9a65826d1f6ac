"""Per-iteration work audit: after the first iteration, mmgcu adds no work to a step.

``tests/programs/per_iteration.py`` trains the tiny config on one simulated card (torch_gcu
2.x and 1.x) in a fresh process and counts the Python calls into mmgcu per source file in
each iteration (see its docstring for how iterations are cut). The audit holds each file
to a budget of calls per iteration, so renaming or moving a function inside a file changes
nothing here, while new per-iteration work in any file does:

- from iteration 2 on, training iterations call only the optimizer wrapper's step path
  (``mmgcu/optim/wrappers.py``), the accelerator's step and the end of its iteration
  (``device/base.py`` on 2.x, ``device/gcu1.py`` on 1.x, where the iteration's graph runs
  then and the next step's seed is drawn, ``device/base.py``'s ``step_seed``;
  ``binding.py``, how the hook that ends it finds the card) and the queue of step
  scalars (``message_hub.py``, the history read it makes through ``compat/mmengine.py``,
  ``hooks/runtime_info.py``; on 1.x the stack of the iteration's scalars the graph
  outputs), and on 1.x what keeps mmseg's step one graph (``model/whole_graph.py``, the
  mmseg code it runs in another form, ``compat/mmseg.py``: the data preprocessor on the
  host, the static-shape accuracy) and the compile watch's interval check
  (``hooks/compile_watch.py``), within their budgets, the same in every iteration;
- validation iterations call only the loop's autocast path (``mmgcu/engine/loops.py``) and the
  message hub, which passes the iteration's host values through;
- iteration 1 calls more: the one-time first-batch check (``mmgcu/model/placement.py``)
  and the placement hook's check of parameters born in the first forward;
- otherwise the placement hook (``mmgcu/engine/hooks/placement.py``) runs before the loop, never
  in it.

Calls into ``mmgcu/sim/`` are the simulated vendor library (what torch_gcu itself does) and
have no budget; the vendor's work is checked as lazy graph runs instead: one per training
iteration on 1.x, none on 2.x. The logger and checkpoint intervals are longer than the run,
so no log line or checkpoint falls in an iteration (logging iterations add the log
processor's calls by design).

The program also trains with a hook that calls mmgcu every iteration, and the audit must
flag it: the test can fail.
"""

import os

import pytest

from tests.conftest import SIM_APIS, last_json, run_program
from tests.e2e.conftest import TINY

PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "per_iteration.py")
ITERS = 5
VAL_ITERS = 3
VENDOR = "mmgcu/sim/"

#: Host-side bookkeeping of the card's step scalars (each logged value is queued, not read):
#: the message hub's queue, its history read of a host value (IterTimerHook's time, through
#: mmgcu.compat) and GCURuntimeInfoHook's check for a new key.
HUB = {"mmgcu/engine/message_hub.py": 14, "mmgcu/compat/mmengine.py": 1}
SCALARS = {**HUB, "mmgcu/engine/hooks/runtime_info.py": 1, "mmgcu/binding.py": 1}
#: What stacks the iteration's scalars for the graph of a lazy card (seal).
SEAL = {"mmgcu/engine/message_hub.py": 22}
#: Calls per training iteration (from the 2nd on) each file may make, by accelerator kind.
TRAIN_BUDGET = {
    "gcu2": {"mmgcu/optim/wrappers.py": 3, "mmgcu/device/base.py": 2, **SCALARS},
    "gcu1": {
        "mmgcu/optim/wrappers.py": 3,
        "mmgcu/device/gcu1.py": 8,
        "mmgcu/device/base.py": 1,  # the next step's seed (step_seed)
        **SCALARS,
        **SEAL,
        "mmgcu/model/whole_graph.py": 4,
        "mmgcu/compat/mmseg.py": 6,
        "mmgcu/engine/hooks/compile_watch.py": 1,
    },
}
#: Calls per validation iteration each file may make (the loop's autocast; the hub passes
#: the iteration's host values through; on 1.x the batch made on the host and padded to its
#: shape bucket, the prediction post-processed on the host, the compile watch's count of
#: images, and in the first iteration its reading of the card's compiles).
VAL_BUDGET = {
    "mmgcu/engine/loops.py": 2,
    "mmgcu/engine/message_hub.py": 5,
    "mmgcu/compat/mmengine.py": 1,
}
VAL_BUDGET = {
    "gcu2": VAL_BUDGET,
    "gcu1": {
        **VAL_BUDGET,
        "mmgcu/model/whole_graph.py": 13,
        "mmgcu/compat/mmseg.py": 6,
        "mmgcu/engine/hooks/compile_watch.py": 1,
    },
}
#: What the first validation iteration adds: the compile watch reads the card's count.
VAL_FIRST = {
    "gcu2": {},
    "gcu1": {"mmgcu/engine/hooks/compile_watch.py": 2, "mmgcu/device/gcu1.py": 1},
}
#: Lazy graphs the simulated vendor runs per training iteration, and per validation
#: iteration (the prediction's one read: the graph of the batch).
GRAPH_RUNS = {"gcu2": 0, "gcu1": 1}
FIRST_BATCH_CHECK = "mmgcu/model/placement.py"
PLACEMENT_HOOK = "mmgcu/engine/hooks/placement.py"


def plugin(counts):
    """``counts`` without the simulated vendor's files."""
    return {path: n for path, n in counts.items() if not path.startswith(VENDOR)}


def over_budget(counts, budget):
    """What in ``counts`` is beyond ``budget``, and which budgeted file was not called."""
    problems = [
        f"{path}: {n} call(s), budget {budget.get(path, 0)}"
        for path, n in sorted(counts.items())
        if n > budget.get(path, 0)
    ]
    problems += [f"{path}: not called" for path in sorted(budget) if path not in counts]
    return problems


def audit(run, kind):
    """What is wrong with one run (empty: nothing)."""
    segments, graph_runs = run["segments"], run["graph_runs"]
    train = [plugin(segments.get(f"train:{k}", {})) for k in range(1, ITERS + 1)]
    val = [plugin(segments.get(f"val:{k}", {})) for k in range(1, VAL_ITERS + 1)]
    problems = []
    for k, counts in enumerate(train[1:], 2):
        problems += [f"train iteration {k}: {p}" for p in over_budget(counts, TRAIN_BUDGET[kind])]
        if counts != train[1]:
            problems.append(f"train iteration {k} differs from iteration 2: {counts}")
    for k, counts in enumerate(val, 1):
        budget = dict(VAL_BUDGET[kind])
        for path, n in (VAL_FIRST[kind] if k == 1 else {}).items():
            budget[path] = budget.get(path, 0) + n
        problems += [f"val iteration {k}: {p}" for p in over_budget(counts, budget)]
    for k in range(1, ITERS + 1):
        if graph_runs.get(f"train:{k}") != GRAPH_RUNS[kind]:
            problems.append(f"train iteration {k}: {graph_runs.get(f'train:{k}')} graph runs")
    if any(graph_runs.get(f"val:{k}") != GRAPH_RUNS[kind] for k in range(1, VAL_ITERS + 1)):
        problems.append(f"graph runs in validation: {graph_runs}")
    first, second = train[0], train[1]
    if FIRST_BATCH_CHECK not in first:
        problems.append(f"iteration 1 ran no first-batch check: {first}")
    if not (sum(first.values()) > sum(second.values()) and set(second) <= set(first)):
        problems.append(f"iteration 1 ({first}) does not call more than iteration 2 ({second})")
    for counts in train[1:] + val:  # iteration 1 may check parameters born in its forward
        if PLACEMENT_HOOK in counts:
            problems.append(f"the placement hook runs inside an iteration: {counts}")
    if PLACEMENT_HOOK not in segments.get("setup", {}):
        problems.append(f"no placement check before the loop: {segments.get('setup')}")
    return problems


@pytest.mark.parametrize("kind", SIM_APIS)
def test_no_per_iteration_work_after_the_first(kind, dataset, tmp_path):
    proc = run_program(
        PROGRAM,
        TINY,
        dataset,
        tmp_path,
        ITERS,
        VAL_ITERS,
        timeout=300,
        MMGCU_SIMULATE=1,
        MMGCU_SIMULATE_API=kind,
        OMP_NUM_THREADS=1,
    )
    runs = last_json(proc.stdout)
    clean = runs["clean"]
    assert (clean["kind"], clean["optim_wrapper"], clean["val_loop"]) == (
        kind,
        "GCUOptimWrapper",
        "GCUValLoop",
    )
    problems = audit(clean, kind)
    assert not problems, "\n".join(problems) + f"\n{clean}"
    # The same audit catches mmgcu work added to every iteration.
    injected = audit(runs["injected"], kind)
    assert any(p.startswith("train iteration 2: mmgcu/model/placement.py") for p in injected), (
        injected
    )

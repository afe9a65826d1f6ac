"""Write ``mmgcu/sim/xla_ops.py``: the ops torch_xla lowers, for the simulated XLA card.

The simulated card (torch_gcu 1.x) decides per op whether it joins the lazy graph or falls
back to the CPU after a cut, as torch_xla does. An op falls back where torch_xla has no
kernel for it and torch has only device kernels (CPU, CUDA); an op with a composite kernel
(CompositeImplicitAutograd or CompositeExplicitAutograd) decomposes into others on any
backend that does not register it. This tool gathers, for both torch_xla generations:

- torch_xla 1.10 (what torch_gcu 1.x forks): the ops of its ``xla_native_functions.yaml``
  at tag v1.10.0, read from a git clone of pytorch/xla, and torch 1.10's composites, asked
  of the torch 1.10 this tool runs with (the T20 stack's Python);
- torch_xla 2.9 (the conformance suite's real runtime): the ops with an XLA kernel and
  torch 2.9's composites, asked of the live dispatcher of a Python with torch_xla 2.9
  (``--xla-python``), and the yaml's ``autograd:`` section (ops torch_xla differentiates
  itself, whose backward ops torch's autograd then never calls).

    .venv-t20/bin/python tools/xla_ops.py --xla-git PATH/TO/xla/.git \\
        --xla-python .venv-xla/bin/python
"""

import argparse
import json
import os.path as osp
import subprocess
import sys

LISTS = {
    "1.10": ("v1.10.0", "xla_native_functions.yaml"),
    "2.9": ("v2.9.0", "codegen/xla_native_functions.yaml"),
}
OUT = osp.join(osp.dirname(osp.dirname(osp.abspath(__file__))), "mmgcu", "sim", "xla_ops.py")


def base_name(entry: str) -> str:
    """``add.Tensor`` -> ``add``; ``bernoulli_.float`` -> ``bernoulli`` (the simulator
    looks ops up by name, without overload or in-place underscore)."""
    name = entry.split(".")[0]
    return name[:-1] if name.endswith("_") else name


def yaml_ops(git_dir: str, tag: str, path: str, section: str = "") -> set:
    """The ops a yaml lists (only those of ``section``, e.g. ``autograd``, when given)."""
    text = subprocess.run(
        ["git", "--git-dir", git_dir, "show", f"{tag}:{path}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    ops, current = set(), ""
    for line in text.splitlines():
        if line and not line.startswith((" ", "#")) and line.rstrip().endswith(":"):
            current = line.rstrip()[:-1]
        elif line.strip().startswith("- ") and (not section or current == section):
            ops.add(base_name(line.strip()[2:]))
    return ops


COMPOSITES = ("CompositeImplicitAutograd", "CompositeExplicitAutograd")
#: Run by ``--xla-python``: torch 2.9's ops with an XLA kernel and its composites, as JSON.
XLA_QUERY = """
import json, os
os.environ.setdefault("PJRT_DEVICE", "CPU")
import torch, torch_xla
xla, composite = set(), set()
for s in torch._C._jit_get_all_schemas():
    if not s.name.startswith("aten::"):
        continue
    q = s.name + ("." + s.overload_name if s.overload_name else "")
    try:  # a JIT-only schema (aten::has_torch_function) is not a dispatcher op
        torch._C._dispatch_has_kernel_for_dispatch_key(q, "CPU")
    except RuntimeError:
        continue
    has = lambda key: torch._C._dispatch_has_kernel_for_dispatch_key(q, key)
    if has("XLA") or has("AutogradXLA"):
        xla.add(s.name[6:])
    elif any(has(key) for key in COMPOSITES):
        composite.add(s.name[6:])
print(json.dumps(dict(xla=sorted(xla), composite=sorted(composite))))
""".replace("COMPOSITES", repr(COMPOSITES))


def torch110_ops() -> tuple:
    """(every aten op name of this torch, those with a composite kernel, which decompose
    on a backend that does not register them)."""
    import torch

    if not torch.__version__.startswith("1.10"):
        sys.exit(f"run this with torch 1.10 (the T20 stack), not torch {torch.__version__}")
    names, composite = set(), set()
    for schema in torch._C._jit_get_all_schemas():
        if not schema.name.startswith("aten::"):
            continue
        op = schema.name[len("aten::") :]
        names.add(base_name(op))
        qualified = schema.name + (f".{schema.overload_name}" if schema.overload_name else "")
        # torch 1.10 has no _dispatch_has_kernel_for_dispatch_key: its dump lists the keys
        dump = torch._C._dispatch_dump(qualified)
        if any(f"\n{key}[alias]:" in dump for key in COMPOSITES):
            composite.add(base_name(op))
    return names, composite


def torch29_ops(python: str) -> tuple:
    """(ops with an XLA kernel, ops with a composite kernel) of torch 2.9 with torch_xla."""
    out = subprocess.run([python, "-c", XLA_QUERY], check=True, capture_output=True, text=True)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    return {base_name(n) for n in found["xla"]}, {base_name(n) for n in found["composite"]}


def words(names) -> str:
    """A frozenset literal: the sorted names in a string, wrapped at 99 columns."""
    out, line = [], ""
    for name in sorted(names):
        if line and len(line) + len(name) + 1 > 95:
            out.append(line)
            line = ""
        line = f"{line} {name}" if line else name
    out.append(line)
    return 'frozenset(\n    """\n' + "\n".join(f"    {w}" for w in out) + '\n    """.split()\n)'


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--xla-git", required=True, help="the .git folder of a pytorch/xla clone")
    parser.add_argument("--xla-python", required=True, help="a Python with torch_xla 2.9")
    parser.add_argument("--out", default=OUT)
    args = parser.parse_args()
    lowered = {v: yaml_ops(args.xla_git, *LISTS[v]) for v in LISTS}
    autograd = set().union(*(yaml_ops(args.xla_git, *LISTS[v], "autograd") for v in LISTS))
    names, composite = torch110_ops()
    xla_29, composite_29 = torch29_ops(args.xla_python)
    lowered["2.9"] |= xla_29
    text = f'''"""The ops torch_xla lowers into its graph, by name (overload and in-place underscore
left out), for the simulated XLA card (``csrc/lazy_ops.h`` adds the calls that fall back
although listed). Generated by ``tools/xla_ops.py`` from torch_xla's
xla_native_functions.yaml at v1.10.0 and v2.9.0 and from torch 1.10's op registry; do not
edit by hand.
"""

#: torch_xla 1.10 (what torch_gcu 1.x forks): ``xla_native_functions.yaml`` at v1.10.0.
LOWERED_1_10 = {words(lowered["1.10"])}

#: torch_xla 2.9 (the conformance suite's real runtime): its yaml's ops and those with an XLA
#: kernel in its live dispatcher.
LOWERED_2_9 = {words(lowered["2.9"])}

#: Ops with a composite kernel in torch 1.10 (CompositeImplicitAutograd or
#: CompositeExplicitAutograd): on a card that does not register them they decompose into
#: others, so where torch 2 sends one to the card whole, the T20 runs what 1.10 makes of it.
COMPOSITE_1_10 = {words(composite - lowered["1.10"])}

#: The same in torch 2.9, for the conformance suite's profile.
COMPOSITE_2_9 = {words(composite_29 - lowered["2.9"])}

#: Ops torch 2 has and torch 1.10 has not, among those torch_xla 2.9 lowers: torch 2's names
#: for what the T20's torch 1.10 does under other names.
NEW_IN_TORCH2_LOWERED = {words(lowered["2.9"] - names)}

#: The backward ops of the ops torch_xla differentiates itself (its yaml's ``autograd:``
#: section): torch's autograd never hands them to the card there (and torch 1.10 decomposes
#: native_layer_norm and native_group_norm before any backend sees them).
AUTOGRAD_BACKWARD = {words({f"{op}_backward" for op in autograd})}

#: torch 1.10's own ops that only a lowered op's composite kernel calls: torch_xla 1.10
#: registers that op (``cat``), so the card never sees its ``_cat``.
REACHED_THROUGH_LOWERED_1_10 = frozenset({{"_cat"}})
'''
    with open(args.out, "w") as f:
        f.write(text)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

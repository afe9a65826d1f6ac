"""Section 6, ``sync_bn``: one ``GCUSyncBatchNorm`` layer against ``nn.BatchNorm2d``, forward
plus backward, on 2 gloo ranks on the CPU (``tools/benchmarks/sync_bn.py``'s ``measure()``,
:mod:`timeit`), and the layer's collectives per call. On the CPU the gloo round trips
dominate; the local-ops variant (a group whose all-reduce does nothing) is what the layer
costs apart from its collectives.
"""

import importlib.util
import os.path as osp

from harness import HERE, log

TITLE = "SyncBN"


def needs_simulator(args):
    return False


def _layer_bench():
    """tools/benchmarks/sync_bn.py (not this module, which has the same name)."""
    spec = importlib.util.spec_from_file_location("sync_bn_bench", osp.join(HERE, "sync_bn.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(h):
    a = h.args
    bench = _layer_bench()
    log(f"sync_bn: {a.sync_bn_ranks} gloo ranks, {a.sync_bn_repeat} x {a.sync_bn_number} calls")
    return bench.measure(
        world_size=a.sync_bn_ranks,
        number=a.sync_bn_number,
        repeat=a.sync_bn_repeat,
        threads=a.threads,
        python=h.python,
        timeout=a.timeout,
    )


def _collectives(r):
    return (
        f"{r['collectives_forward']} fwd ({'+'.join(map(str, r['floats_forward']))} floats) "
        f"+ {r['collectives_backward']} bwd ({'+'.join(map(str, r['floats_backward']))})"
    )


def rows(result):
    out = []
    n = result["world_size"]
    for shape, r in result["shapes"].items():
        sync_vs_bn = f"{r['gcu_sync_bn_ms']:.3f} vs {r['bn_ms']:.3f}"
        out += [
            (f"fwd+bwd, GCUSyncBatchNorm vs BN, {shape}, {n} ranks", sync_vs_bn, "ms", "", ""),
            (f"  GCUSyncBatchNorm / BN, {shape}", r["gcu_sync_bn_over_bn"], "x", "info", ""),
            (f"  local ops only (no-op all-reduce), {shape}", r["gcu_sync_bn_local_ms"], "ms"),
            (f"  one gloo all-reduce of 2C+1 floats, {shape}", r["all_reduce_ms"], "ms"),
            (f"  collectives per call, {shape}", _collectives(r), "", "", ""),
        ]
    return [row + ("", "")[: 5 - len(row)] for row in out]

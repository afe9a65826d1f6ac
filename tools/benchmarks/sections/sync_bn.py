"""Section 6, ``sync_bn``: one ``GCUSyncBatchNorm`` layer against its peer, torch's
``nn.SyncBatchNorm`` algorithm and collectives on the same gloo group (``torch_sync_bn.py``:
torch's own layer refuses CPU inputs), and against ``nn.BatchNorm2d``; forward plus
backward, on 2 and 4 gloo ranks on the CPU (``tools/benchmarks/sync_bn.py``'s
``measure()``, :mod:`timeit`), and the layer's collectives per call. Target: GCUSyncBatchNorm
/ peer <= 1.0 on every shape and rank count, the two layers agreeing (outputs and input
gradients within 1e-4). On the CPU the gloo round trips dominate; the local-ops variant (a
group whose all-reduce does nothing) is what the layer costs apart from its collectives.
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


RATIO_TARGET = 1.0
AGREE = 1e-4


def run(h):
    a = h.args
    bench = _layer_bench()
    out = dict(target=f"GCUSyncBatchNorm / torch's algorithm <= {RATIO_TARGET}", ranks={})
    for n in a.sync_bn_ranks:
        log(f"sync_bn: {n} gloo ranks, {a.sync_bn_repeat} x {a.sync_bn_number} calls")
        result = bench.measure(
            world_size=n,
            number=a.sync_bn_number,
            repeat=a.sync_bn_repeat,
            threads=a.threads,
            python=h.python,
            timeout=a.timeout,
        )
        for r in result["shapes"].values():
            r["passed"] = (
                r["gcu_sync_bn_over_torch"] <= RATIO_TARGET and r["max_abs_diff_vs_torch"] <= AGREE
            )
        out["ranks"][str(n)] = result
    out["passed"] = all(r["passed"] for m in out["ranks"].values() for r in m["shapes"].values())
    return out


def _collectives(r):
    return (
        f"{r['collectives_forward']} fwd ({'+'.join(map(str, r['floats_forward']))} floats) "
        f"+ {r['collectives_backward']} bwd ({'+'.join(map(str, r['floats_backward']))})"
    )


def _rank_rows(n, result):
    out = []
    for shape, r in result["shapes"].items():
        c = shape.split("x")[1]
        mine_vs_peer = f"{r['gcu_sync_bn_ms']:.3f} vs {r['torch_sync_bn_ms']:.3f}"
        verdict = "PASS" if r["passed"] else "FAIL"
        out += [
            (f"fwd+bwd, GCUSyncBatchNorm vs torch's SyncBN algorithm, {shape}, {n} ranks",
             mine_vs_peer, "ms", "", ""),
            (f"  GCUSyncBatchNorm / torch's, {shape}, {n} ranks", r["gcu_sync_bn_over_torch"],
             "x", f"<= {RATIO_TARGET}", verdict),
            (f"  the same, slowest rank, {shape}, {n} ranks", r["slowest_rank_over_torch"], "x"),
            (f"  outputs and input gradients apart, max, {shape}, {n} ranks",
             r["max_abs_diff_vs_torch"], "", f"<= {AGREE:g}", verdict),
            (f"  GCUSyncBatchNorm / BN ({r['bn_ms']:.3f} ms), {shape}, {n} ranks",
             r["gcu_sync_bn_over_bn"], "x", "info"),
            (f"  local ops only (no-op all-reduce), {shape}, {n} ranks",
             r["gcu_sync_bn_local_ms"], "ms"),
            (f"  one gloo all-reduce of 2C+1 floats, {shape}, {n} ranks", r["all_reduce_ms"],
             "ms"),
            (f"  collectives per call, {shape}: GCUSyncBatchNorm", _collectives(r), "", "", ""),
            (f"  collectives per call, {shape}: torch's", f"1 all_gather fwd ({2 * int(c) + 1} "
             f"floats a rank) + 1 all_reduce bwd ({2 * int(c)})", "", "", ""),
        ]  # fmt: skip
    return out


def rows(result):
    out = []
    for n, r in result["ranks"].items():
        out += _rank_rows(n, r)
    return [row + ("", "")[: 5 - len(row)] for row in out]

"""Section 4, ``simcost``: a simulated card against the same model on the plain CPU, in one
process, for each simulated API: a training step and single ops (``tools/benchmarks/
simcost.py``, timed with :mod:`timeit`). A simulated card says nothing about GCU speed; this
says what a rehearsal costs.
"""

import os.path as osp

from harness import HERE, log

TITLE = "simcost"


def needs_simulator(args):
    return True


def run(h):
    a = h.args
    out = {}
    for api in a.simcost_apis:
        log(f"simcost: {api}")
        cmd = [h.python, osp.join(HERE, "simcost.py"), "--steps", str(a.simcost_steps)]
        cmd += ["--op-number", str(a.simcost_op_number), "--op-repeat", str(a.simcost_repeat)]
        code, _, _, path = h.run(cmd, h.env(simulate=1, api=api), f"simcost-{api}")
        h.check(code, path, "simcost.py")
        out[api] = h.last_json(path)
    return out


def _api_rows(api, c):
    m = c["step_median_s"]
    same = c["first_loss"]["cpu"] == c["first_loss"]["card"]
    out = [
        (f"train step (fwd+bwd+SGD), CPU [{api}]", m["cpu"] * 1000.0, "ms", "", ""),
        (f"train step, simulated {c['card']} [{api}]", m["card"] * 1000.0, "ms", "", ""),
        (f"train step, card / CPU [{api}]", m["ratio"], "x", "info", ""),
        (f"first-step loss equal on CPU and card [{api}]", "yes" if same else "no", "", "", ""),
    ]
    for op, row in c["ops"].items():
        value = f"{row['cpu_us']:.1f} / {row['card_us']:.1f} / {row['overhead_us']:+.1f}"
        out.append((f"{op}: CPU / card / overhead [{api}]", value, "us", "", ""))
    return out


def rows(sc):
    out = []
    for api, c in sc.items():
        out += _api_rows(api, c)
    return out

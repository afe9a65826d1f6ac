"""bench.py's report: the table (each section's rows, in order) and the JSON file, from which
``performance.py`` writes docs/performance.md."""

import json
import os
import os.path as osp

import sections

COLUMNS = ("section", "measurement", "value", "unit", "target", "verdict")


def table_rows(results):
    """(section, measurement, value, unit, target, verdict) rows, in the sections' order."""
    rows = []
    for name in sections.NAMES:
        if results.get(name):
            label = sections.label(name)
            rows += [(label,) + tuple(row) for row in sections.module(name).rows(results[name])]
    return rows


def error_rows(errors):
    return [
        (sections.label(n), "ERROR (see JSON)", str(e).splitlines()[0][:60], "", "", "FAIL")
        for n, e in errors.items()
    ]


def _cell(v):
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def format_table(rows):
    cells = [COLUMNS] + [tuple(_cell(v) for v in row) for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(COLUMNS))]
    lines = []
    for n, r in enumerate(cells):
        lines.append("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |")
        if n == 0:
            lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def machine_line(info, quick=False):
    return (
        f"mmgcu bench, {info['date']}, {info['cpu_model']} ({info['usable_cpus']} CPUs), "
        f"Python {info['python']}, torch {info['torch']}, load {info['load1_at_start'] or 0:.2f}"
        + (" [QUICK: smoke sizes, not a measurement]" if quick else "")
    )


def build(info, args, results, loads, errors, extension, total_s):
    """The JSON report: everything measured and the table."""
    rows = table_rows(results) + error_rows(errors)
    passed = all(r[5] != "FAIL" for r in rows)
    if args.quick:  # smoke sizes: a verdict is only a sign that the section ran
        rows = [r[:5] + (f"{r[5]} (quick)" if r[5] else "",) for r in rows]
    return dict(
        schema=2,
        machine=info,
        args=dict(vars(args)),
        sections=results,
        section_load=loads,
        errors=errors,
        extension=extension,
        total_s=total_s,
        table=[dict(zip(COLUMNS, r)) for r in rows],
        passed=passed,
    )


def write(report, path):
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=1)


def show(report, path, quick=False):
    """Print the machine line and the table."""
    rows = [tuple(r[c] for c in COLUMNS) for r in report["table"]]
    print("\n" + machine_line(report["machine"], quick))
    print(format_table(rows))
    print(f"\n{path} written ({report['total_s']:.0f} s)")

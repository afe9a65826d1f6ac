"""docs/performance.md from the bench runs kept in ``runs/`` (``make bench`` runs it).

    python tools/benchmarks/performance.py [--add REPORT.json ...] [--out docs/performance.md]

``--add`` keeps a report of ``bench.py`` in ``runs/``, without this machine's paths (a
``--quick`` report is not kept: its sizes measure nothing), and removes the kept runs whose
every section a newer kept run measured. The doc takes each section's rows from the newest
kept run that measured it, under a heading that names the run (date, commit, command) and a
line that gives the machine and its load. A section that no kept run measured shows the rows
of ``recorded.md``: runs whose report is not kept, each named the same way. The text around
the tables is ``performance.md.in``'s.
"""

import argparse
import glob
import json
import os
import os.path as osp

import bench
import rows
import sections

HERE = osp.dirname(osp.abspath(__file__))
RUNS = osp.join(HERE, "runs")
RECORDED = osp.join(HERE, "recorded.md")
TEMPLATE = osp.join(HERE, "performance.md.in")
DOC = osp.join(osp.dirname(osp.dirname(HERE)), "docs", "performance.md")
MARK = "<!-- runs -->"
#: The fields of a report that hold this machine's paths: a kept run has none of them.
PATHS = dict(
    machine=("python_executable", "repo"),
    args=("out", "python", "workdir", "ext_dir"),
    extension=("dir",),
)
#: Options that do not change what a run measures, left out of its command.
UNNAMED = ("out", "python", "workdir", "keep", "ext_dir", "rehearsal_api", "sections")


def strip(report: dict) -> dict:
    """``report`` without this machine's paths and ``readme`` rows (the doc has its own)."""
    out = {k: v for k, v in report.items() if k != "readme"}
    for key, fields in PATHS.items():
        out[key] = {k: v for k, v in (report.get(key) or {}).items() if k not in fields}
    return out


def keep(path: str, runs: str = RUNS):
    """Copy the bench report ``path`` into ``runs``; return the kept file's path, or None for
    a ``--quick`` run."""
    with open(path) as f:
        report = json.load(f)
    if report["args"].get("quick"):
        return None
    measured = [n for n in sections.NAMES if report["sections"].get(n)]
    if not measured:
        raise SystemExit(f"{path}: no section measured anything")
    stamp = report["machine"]["date"][:19].replace("-", "").replace(":", "")
    names = "all" if measured == list(sections.NAMES) else "-".join(measured)
    os.makedirs(runs, exist_ok=True)
    kept = osp.join(runs, f"{stamp}-{names}.json")
    with open(kept, "w") as f:
        json.dump(strip(report), f, indent=1)
        f.write("\n")
    return kept


def kept_runs(runs: str = RUNS) -> list:
    """``(path, report)`` of every kept run, oldest first."""
    out = []
    for path in glob.glob(osp.join(runs, "*.json")):
        with open(path) as f:
            out.append((path, json.load(f)))
    return sorted(out, key=lambda p: p[1]["machine"]["date"])


def recorded_runs(path: str = RECORDED) -> list:
    """The runs of ``recorded.md``: dicts of ``heading``, ``line`` and ``rows`` by section."""
    runs, section = [], None
    with open(path, encoding="utf-8") as f:
        text = f.read().split("-->", 1)[-1]
    for line in text.splitlines():
        if line.startswith("## "):
            runs.append(dict(heading=line[3:].strip(), line="", rows={}))
        elif line.startswith("### "):
            section = line[4:].strip()
            runs[-1]["rows"][section] = []
        elif line.startswith("|"):
            runs[-1]["rows"][section].append(line)
        elif line.strip() and not runs[-1]["rows"]:
            runs[-1]["line"] = (runs[-1]["line"] + " " + line.strip()).strip()
    return runs


def command(args: dict) -> str:
    """The ``bench.py`` command line of a run's ``args``: the options not at their default."""
    defaults = vars(bench.parse_args([]))
    words = ["bench.py"]
    if list(args.get("sections") or ()) != list(sections.NAMES):
        words.append("--sections " + ",".join(args["sections"]))
    for key, value in args.items():
        if key in UNNAMED or key not in defaults or value == defaults[key]:
            continue
        option = "--" + key.replace("_", "-")
        if value is True:
            words.append(option)
        elif isinstance(value, list):
            words.append(f"{option} {','.join(str(v) for v in value)}")
        else:
            words.append(f"{option} {value}")
    return " ".join(words)


def heading(report: dict) -> str:
    m = report["machine"]
    commit = (m.get("git_commit") or "unknown")[:7]
    dirty = " (uncommitted changes)" if m.get("git_dirty") else ""
    return f"{m['date'][:10]}, commit {commit}{dirty}: `{command(report['args'])}`"


def machine_line(report: dict) -> str:
    m, loads = report["machine"], report.get("section_load") or {}
    around = [v for r in loads.values() for v in (r.get("load1_before"), r.get("load1_after"))]
    around = [v for v in around if v is not None]
    line = (
        f"{m['usable_cpus']} vCPU {m['cpu_model']}, Python {m['python']}, torch {m['torch']}, "
        f"mmengine {m['mmengine']}, mmseg {m['mmsegmentation']}; load average "
        f"{m['load1_at_start'] or 0:.1f} at the start"
    )
    if around:
        line += f", {min(around):.1f} to {max(around):.1f} around the sections"
    line += f"; {report['total_s']:.0f} s in all."
    if report.get("errors"):
        line += f" Failed, so not shown: {', '.join(sorted(report['errors']))}."
    return line


def choose(reports: list, recorded: list) -> dict:
    """The doc's runs in the order of their first section, by the id of their report:
    ``[heading, line, rows]``, each section from the newest kept run that has it, else from
    the recorded run that has it."""
    extra = [n for run in recorded for n in run["rows"] if n not in sections.NAMES]
    blocks = {}
    for name in list(sections.NAMES) + extra:
        having = [r for _, r in reports if (r.get("sections") or {}).get(name)]
        if having and name in sections.NAMES:
            run = having[-1]
            block = blocks.setdefault(id(run), [heading(run), machine_line(run), []])
            block[2].extend(rows.section(name, run["sections"][name]))
            continue
        for run in recorded:
            if name in run["rows"]:
                block = blocks.setdefault(id(run), [run["heading"], run["line"], []])
                block[2].extend(run["rows"][name])
                break
    return blocks


def render(blocks: list, template: str = TEMPLATE) -> str:
    with open(template, encoding="utf-8") as f:
        text = f.read()
    parts = []
    for title, line, table in blocks:
        parts += [f"### {title}", "", line, "", "| what | value | target |", "|---|---|---|"]
        parts += table + [""]
    return text.replace(MARK, "\n".join(parts).rstrip("\n"))


def write(out: str = DOC, runs: str = RUNS, recorded: str = RECORDED) -> list:
    """Write the doc; return the kept runs it shows none of."""
    reports = kept_runs(runs)
    blocks = choose(reports, recorded_runs(recorded))
    with open(out, "w", encoding="utf-8") as f:
        f.write(render(list(blocks.values())))
    return [path for path, report in reports if id(report) not in blocks]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--add", nargs="*", default=[], metavar="REPORT", help="bench.py's JSON")
    p.add_argument("--out", default=DOC, help="the doc to write")
    p.add_argument("--runs", default=RUNS, help="the folder of kept runs")
    args = p.parse_args(argv)
    for path in args.add:
        kept = keep(path, args.runs)
        print(f"performance: kept {path} as {kept}" if kept else f"performance: {path} is a "
              "--quick run (smoke sizes), not kept")  # fmt: skip
    unused = write(args.out, args.runs)
    for path in unused if args.add else ():
        os.remove(path)
        print(f"performance: removed {path} (newer runs measured each of its sections)")
    print(f"performance: wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

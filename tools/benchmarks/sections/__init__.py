"""bench.py's sections, one module each, in the order they run and are reported.

Each module has ``TITLE`` (the table's section label), ``run(h) -> dict`` (``h``: a
:class:`harness.Harness`; the dict is the section's JSON) and ``rows(result) -> list`` of
``(measurement, value, unit, target, verdict)`` for the table. A verdict of ``FAIL`` fails
``--check``.
"""

import importlib

NAMES = (
    "overhead",
    "startup",
    "rehearsal",
    "simcost",
    "host_reads",
    "sync_bn",
    "graphs",
    "padding",
)


def module(name):
    """The module of section ``name``."""
    if name not in NAMES:
        raise KeyError(f"unknown section {name!r}; choose from {', '.join(NAMES)}")
    return importlib.import_module(f"{__name__}.{name}")


def label(name):
    """The table's label of section ``name``: its number and title."""
    if name not in NAMES:
        return name
    return f"{NAMES.index(name) + 1} {module(name).TITLE}"


def needs_simulator(names, args):
    """Whether the sections ``names`` (with ``args``) run the simulator."""
    return any(module(n).needs_simulator(args) for n in names)

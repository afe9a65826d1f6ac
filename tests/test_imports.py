"""The import rules of docs/architecture.md, checked against the code: which room may
import which, no two rooms that import each other (directly or through others), torch_gcu
in the device layer only, no mmengine in the vendor layers."""

import ast
import os
import re

import pytest

from tests.conftest import REPO

MMGCU = os.path.join(REPO, "mmgcu")
DOC = os.path.join(REPO, "docs", "architecture.md")


def rules() -> dict:
    """{room: the rooms it may import}, from the doc's table of rooms."""
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    table = text.split("| room | what it is | may import |", 1)[1].split("\n\n", 1)[0]
    found = {}
    for row in table.strip().splitlines()[1:]:  # after the |---| line
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        room, allowed = re.fullmatch(r"`(\w+)`", cells[0]).group(1), cells[-1]
        found[room] = set() if allowed == "nothing" else set(re.findall(r"`([\w.]+)`", allowed))
    return found


def modules():
    """(module name, path) of every module of mmgcu."""
    for folder, _, files in os.walk(MMGCU):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
                yield (rel[: -len(".__init__")] if rel.endswith(".__init__") else rel), path


def imports(module: str, path: str):
    """(line, absolute module name) of each import in the file, at any depth."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            yield node.lineno, target
            for alias in node.names:  # "from . import sim": the module sim
                yield node.lineno, f"{target}.{alias.name}"
        elif isinstance(node, ast.Call) and _imports_by_name(node):
            yield node.lineno, node.args[0].value  # importlib.import_module("torch_gcu")


def _imports_by_name(call: ast.Call) -> bool:
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return (
        name in ("import_module", "__import__")
        and bool(call.args)
        and isinstance(call.args[0], ast.Constant)
        and isinstance(call.args[0].value, str)
    )


def room_of(name: str):
    parts = name.split(".")
    return parts[1] if parts[0] == "mmgcu" and len(parts) > 1 else None


def test_the_doc_names_every_room():
    rooms = {room_of(m) for m, _ in modules()} - {None}
    assert rooms == set(rules())


def test_each_room_imports_only_what_the_doc_allows():
    allowed, wrong = rules(), []
    for module, path in modules():
        room = room_of(module)
        if room is None:  # mmgcu/__init__.py registers everything
            continue
        for line, target in imports(module, path):
            other = room_of(target)
            if other is None or other == room or other not in allowed:
                continue  # not mmgcu, itself, or a name imported from a module
            if other in allowed[room] or ".".join(target.split(".")[1:3]) in allowed[room]:
                continue
            wrong.append(f"{os.path.relpath(path, REPO)}:{line}: {room} imports {target}")
    assert not wrong, "imports docs/architecture.md does not allow:\n" + "\n".join(wrong)


def imported_rooms() -> dict:
    """{room: the other rooms its modules import}, from the code."""
    found = {}
    for module, path in modules():
        room = room_of(module)
        for _, target in imports(module, path):
            other = room_of(target)
            if room is not None and other in rules() and other != room:
                found.setdefault(room, set()).add(other)
    return found


def cycle(graph: dict):
    """A list of rooms that import each other in a ring (the first one again at its
    end), or None where every import goes one way."""
    done, path = set(), []

    def visit(room):
        if room in path:
            return path[path.index(room) :] + [room]
        if room in done:
            return None
        path.append(room)
        for other in sorted(graph.get(room, ())):
            found = visit(other)
            if found:
                return found
        path.pop()
        done.add(room)
        return None

    return next((found for room in sorted(graph) for found in [visit(room)] if found), None)


def allowed_rooms() -> dict:
    """{room: the other rooms it may import}, from the doc (``device.cards`` is ``device``)."""
    return {r: {a.split(".")[0] for a in allowed} - {r} for r, allowed in rules().items()}


@pytest.mark.parametrize(
    "where, graph", [("docs/architecture.md", allowed_rooms), ("the code", imported_rooms)]
)
def test_rooms_import_one_way(where, graph):
    ring = cycle(graph())
    assert ring is None, f"rooms that import each other in {where}: {' -> '.join(ring)}"


def test_the_check_sees_a_cycle():
    assert cycle({"cli": {"rehearsal"}, "rehearsal": {"launch", "cli"}}) == [
        "cli",
        "rehearsal",
        "cli",
    ]
    assert cycle({"cli": {"rehearsal", "launch"}, "rehearsal": {"launch"}}) is None


@pytest.mark.parametrize(
    "name, only_in",
    [
        ("torch_gcu", ("device",)),
        ("mmengine", tuple(set(rules()) - {"device", "sim", "errors", "version"})),
    ],
)
def test_vendor_and_framework_imports_stay_in_their_rooms(name, only_in):
    wrong = [
        f"{os.path.relpath(path, REPO)}:{line}"
        for module, path in modules()
        for line, target in imports(module, path)
        if target.split(".")[0] == name
        and room_of(module) not in only_in
        and not (name == "torch_gcu" and module.startswith("mmgcu.sim"))
    ]
    assert not wrong, f"{name} imported outside {only_in}: {wrong}"


def test_the_check_sees_a_forbidden_import(tmp_path):
    """The parser resolves relative imports: device importing engine is caught."""
    path = tmp_path / "x.py"
    path.write_text(
        "from ..engine import runner\nfrom . import cards\n"
        "def f():\n    importlib.import_module('torch_gcu')\n"
    )
    assert sorted(t for _, t in imports("mmgcu.device.x", str(path))) == [
        "mmgcu.device",
        "mmgcu.device.cards",
        "mmgcu.engine",
        "mmgcu.engine.runner",
        "torch_gcu",
    ]

"""mmgcu.compat.mmengine: the one module that may use mmengine's private API, pinned to the
upstream source it mirrors."""

import ast
import hashlib
import inspect
import os

import mmengine
import pytest
from mmengine.hooks import EmptyCacheHook

from mmgcu.compat import mmengine as compat
from tests.conftest import REPO

MMGCU = os.path.join(REPO, "mmgcu")
#: The modules allowed a private mmengine name: the compat modules (mmseg's mirrored code
#: reads a private attribute mmseg's preprocessor inherits from mmengine's), and the
#: simulator, which fakes torch_gcu and imports no mmengine (tests/test_imports.py checks it).
ALLOWED = {
    os.path.join(MMGCU, "compat", "mmengine.py"),
    os.path.join(MMGCU, "compat", "mmseg.py"),
    os.path.join(MMGCU, "sim"),
}
#: torch's private names that mmengine uses too, so they are in its source: BatchNorm's
#: ``_check_input_dim`` (for subclasses to override) and a state dict's ``_metadata``.
TORCH_NAMES = {"_check_input_dim", "_metadata"}


@pytest.mark.parametrize("qualified", sorted(compat.UPSTREAM))
def test_upstream_source_is_the_one_mirrored(qualified):
    digest = hashlib.sha256(compat.upstream_source(qualified).encode()).hexdigest()
    assert digest == compat.UPSTREAM[qualified], (
        f"mmengine {mmengine.__version__}'s {qualified} differs from the mmengine "
        f"{compat.MMENGINE_VERSION} one mmgcu.compat.mmengine relies on: read the change, "
        f"update the piece that uses it, then record {digest!r}"
    )


def test_a_changed_upstream_body_is_noticed(monkeypatch):
    """An mmengine whose EmptyCacheHook differs (here: a default flipped) is named by the
    check, and only that object."""
    assert compat.changed_upstream() == {}
    real = inspect.getsource

    def doctored(obj):
        source = real(obj)
        return source.replace("True", "False") if obj is EmptyCacheHook else source

    monkeypatch.setattr(inspect, "getsource", doctored)
    assert list(compat.changed_upstream()) == ["mmengine.hooks.EmptyCacheHook"]


def _mmengine_private_names() -> set:
    """Every private name mmengine's source defines: functions, classes, methods, class
    attributes and the ``self._x`` attributes its classes set."""
    names = set()
    root = os.path.dirname(mmengine.__file__)
    for folder, _, files in os.walk(root):
        for name in files:
            if not name.endswith(".py"):
                continue
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names.add(node.name)
                elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                    names.add(node.attr)
                if isinstance(node, ast.ClassDef):  # class attributes: `_backends: dict = {}`
                    for statement in node.body:
                        targets = getattr(statement, "targets", None) or [
                            getattr(statement, "target", None)
                        ]
                        names.update(t.id for t in targets if isinstance(t, ast.Name))
    return {n for n in names if n.startswith("_") and not n.startswith("__")} - TORCH_NAMES


def _uses(tree, private: set):
    """(line, what) of each use of a name of ``private`` in ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in private:
            yield node.lineno, f".{node.attr}"
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in private:
            yield node.lineno, f"def {node.name}"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mmengine"):
            for alias in node.names:
                if alias.name.startswith("_"):
                    yield node.lineno, f"import {alias.name}"
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value in private:
                yield node.lineno, repr(node.value)


def test_no_private_mmengine_name_outside_the_compat_module():
    private = _mmengine_private_names()
    # The scan sees methods, attributes set in methods and class attributes.
    assert {"_clip_grad", "_load_from", "_statistics_methods"} <= private
    found = []
    for folder, _, files in os.walk(MMGCU):
        for name in sorted(files):
            path = os.path.join(folder, name)
            if not name.endswith(".py") or any(
                path == a or path.startswith(a + os.sep) for a in ALLOWED
            ):
                continue
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read())
            found += [
                f"{os.path.relpath(path, REPO)}:{line}: {what}"
                for line, what in _uses(tree, private)
            ]
    assert not found, "private mmengine names outside mmgcu/compat/mmengine.py:\n" + "\n".join(
        found
    )


def test_the_scan_sees_a_private_use():
    """The scan flags the kinds of use the rule is about."""
    private = {"_clip_grad", "_load_from", "_BatchNormXd"}
    code = (
        "from mmengine.model.utils import _BatchNormXd\n"
        "class W:\n    def _clip_grad(self):\n        return runner._load_from\n"
    )
    assert sorted(what for _, what in _uses(ast.parse(code), private)) == [
        "._load_from",
        "def _clip_grad",
        "import _BatchNormXd",
    ]

"""Functions in mmgcu stay small: each does one job a reader takes in at once."""

import ast
import glob
import os.path as osp

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
MAX_LINES = 60


def long_functions(source: str, limit: int = MAX_LINES):
    """(name, lines) of each function or method in ``source`` longer than ``limit`` lines,
    its decorators and docstring included."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            lines = node.end_lineno - first + 1
            if lines > limit:
                found.append((node.name, lines))
    return found


def test_no_function_in_mmgcu_is_over_60_lines():
    found = [
        f"{osp.relpath(path, REPO)}: {name} ({lines} lines)"
        for path in sorted(glob.glob(osp.join(REPO, "mmgcu", "**", "*.py"), recursive=True))
        for name, lines in long_functions(open(path).read())
    ]
    assert not found, "functions over 60 lines:\n" + "\n".join(found)


def test_the_scan_counts_a_long_method_with_its_decorator():
    body = "\n".join(f"        x{i} = {i}" for i in range(59))
    source = f"class A:\n    @staticmethod\n    def f():\n{body}\n\ndef g():\n    pass\n"
    assert long_functions(source) == [("f", 61)]
    assert long_functions(source, limit=61) == []

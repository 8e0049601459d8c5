"""The code stays readable: short functions, classes of one job, a docstring that says each module's job."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "compress_dqn"


def _nodes():
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        yield path, tree, list(ast.walk(tree))


def test_functions_fit_a_screen_and_classes_hold_one_job():
    long = []
    for path, _, nodes in _nodes():
        for node in nodes:
            lines = getattr(node, "end_lineno", 0) - getattr(node, "lineno", 0) + 1
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and lines > 60:
                long.append(f"{path.name}:{node.lineno} def {node.name}: {lines} lines")
            if isinstance(node, ast.ClassDef) and lines > 210:
                long.append(f"{path.name}:{node.lineno} class {node.name}: {lines} lines")
    assert not long, "split these: " + "; ".join(long)


def test_every_module_says_its_job_in_its_first_docstring_line():
    missing = [path.name for path, tree, _ in _nodes()
               if path.name != "__main__.py" and not (ast.get_docstring(tree) or "").strip().splitlines()[:1]]
    assert not missing, f"modules without a docstring: {missing}"

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
            if isinstance(node, ast.ClassDef) and lines > 200:
                long.append(f"{path.name}:{node.lineno} class {node.name}: {lines} lines")
    assert not long, "split these: " + "; ".join(long)


def test_every_module_says_its_job_in_its_first_docstring_line():
    missing = [path.name for path, tree, _ in _nodes()
               if path.name != "__main__.py" and not (ast.get_docstring(tree) or "").strip().splitlines()[:1]]
    assert not missing, f"modules without a docstring: {missing}"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_module_outgrows_a_few_hundred_lines():
    long = [f"{path.relative_to(PACKAGE)}: {n} lines" for path in PACKAGE.rglob("*.py")
            if (n := len(path.read_text().splitlines())) > 450]
    assert not long, "split these along their concerns: " + "; ".join(long)


def _imports(tree: ast.AST, modules: set[str]) -> set[str]:
    """The package modules a module imports anywhere (a function-level import counts too)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("compress_dqn"):
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                found.add(child if child in modules else node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in modules}
    return found & modules


def test_no_import_circles():
    trees = {_module_name(path): ast.parse(path.read_text()) for path in PACKAGE.rglob("*.py")}
    graph = {name: _imports(tree, set(trees)) - {name} for name, tree in trees.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    circles = []

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for other in sorted(graph[name]):
            if state.get(other) == 1:
                circles.append(" -> ".join(path[path.index(other):] + [other]))
            elif other not in state:
                visit(other, path + [other])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not circles, "import circles: " + "; ".join(circles)


def test_no_module_imports_another_modules_private_names():
    found = []
    for path, tree, nodes in _nodes():
        for node in nodes:
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("compress_dqn"):
                found += [f"{path.relative_to(PACKAGE)}:{node.lineno} {alias.name} from {node.module}"
                          for alias in node.names if alias.name.startswith("_") and not alias.name.endswith("__")]
    assert not found, "make these public where they are defined: " + "; ".join(found)


def test_the_import_contracts_hold():
    """pyproject.toml's import-linter contracts: no package imports one above it, and the
    TensorFlow-free packages (the TFLite path, validate, the report) never reach TensorFlow."""
    import subprocess
    import sys

    lint = Path(sys.executable).parent / "lint-imports"
    done = subprocess.run([str(lint), "--no-cache"], cwd=PACKAGE.parent, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]

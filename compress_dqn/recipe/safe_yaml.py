"""Read a YAML recipe safely: size, encoding, nesting and alias-expansion limits, one-line errors.

yaml.safe_load alone builds no objects, but it still accepts a "billion laughs" of aliases, a
self-referencing anchor, or nesting deep enough to overflow the recursive composer. Every way a
file can be bad becomes one UserError naming the file and what to fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from compress_dqn.errors import UserError
from compress_dqn.fileio import read_user_file

_MAX_RECIPE_BYTES = 1 << 20
_MAX_EXPANDED_NODES = 100_000


_MAX_DEPTH = 64
_SCANNER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's scanner where PyYAML was built with it: the depth check only counts tokens, and the pure-Python
scanner was most of the time a recipe takes to read (the recipe fuzz test's 1,000 recipes: ~60%)."""
_OPEN = (yaml.BlockMappingStartToken, yaml.BlockSequenceStartToken, yaml.FlowMappingStartToken, yaml.FlowSequenceStartToken)
_CLOSE = (yaml.BlockEndToken, yaml.FlowMappingEndToken, yaml.FlowSequenceEndToken)


def _check_depth(text: str, path: Path) -> None:
    """Refuse absurd nesting from the token stream, before the recursive composer meets it."""
    depth = 0
    for token in yaml.scan(text, Loader=_SCANNER):
        if isinstance(token, _OPEN):
            depth += 1
            if depth > _MAX_DEPTH:
                raise UserError(f"{path}: YAML nests more than {_MAX_DEPTH} levels deep (line {token.start_mark.line + 1}); is it a recipe?")
        elif isinstance(token, _CLOSE):
            depth -= 1


def _check_expansion(root: yaml.Node | None, path: Path) -> None:
    """Refuse aliases that refer to themselves or expand past _MAX_EXPANDED_NODES values.

    yaml.safe_load shares aliased nodes, so a few lines of anchors ("billion laughs") load fast
    but expand exponentially when validated; a self-referencing anchor loads as a cyclic list.
    """
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise UserError(f"{path}: a YAML anchor refers to itself (line {node.start_mark.line + 1}); recipes cannot be recursive")
        active.add(key)
        if isinstance(node, yaml.SequenceNode):
            total = 1 + sum(size(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total = 1 + sum(size(k) + size(v) for k, v in node.value)
        else:
            total = 1
        active.discard(key)
        if total > _MAX_EXPANDED_NODES:
            raise UserError(f"{path}: YAML aliases expand to more than {_MAX_EXPANDED_NODES} values; write the recipe out without nested anchors")
        sizes[key] = total
        return total

    if root is not None:
        size(root)


def _check_duplicates(root: yaml.Node | None, path: Path | str) -> None:
    """Refuse a mapping that repeats a key: YAML loaders keep the last one silently, so a second
    `train:` section would drop the first without a word."""
    seen_nodes: set[int] = set()
    stack = [root] if root is not None else []
    while stack:
        node = stack.pop()
        if id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            keys: set[str] = set()
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode):
                    if key.value in keys:
                        raise UserError(f"{path}: duplicate key {key.value!r} at line {key.start_mark.line + 1}; "
                                        "merge the two entries (YAML would keep only the last)")
                    keys.add(key.value)
                stack += [key, value]
        elif isinstance(node, yaml.SequenceNode):
            stack += node.value


def read_yaml(path: str | Path) -> Any:
    """Read YAML data safely, turning every way a file can be bad into one-line UserErrors."""
    path = Path(path)
    raw = read_user_file(path, "a recipe .yaml file")
    if len(raw) > _MAX_RECIPE_BYTES:
        raise UserError(f"{path}: {len(raw)} bytes is too large for a recipe (at most {_MAX_RECIPE_BYTES}); is it the right file?")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text (bad byte at offset {exc.start}); save it as UTF-8") from None
    return read_yaml_text(text, path)


def read_yaml_text(text: str, path: Path | str) -> Any:
    """YAML text (a file's, or a --set value) through the same guards; `path` names it in errors."""
    if len(text) > _MAX_RECIPE_BYTES:
        raise UserError(f"{path}: {len(text)} characters is too long (at most {_MAX_RECIPE_BYTES})")
    try:
        _check_depth(text, path)
        loader = yaml.SafeLoader(text)  # composed once: the checks and the data read the same nodes
        try:
            root = loader.get_single_node()
            _check_expansion(root, path)
            _check_duplicates(root, path)
            return None if root is None else loader.construct_document(root)
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = exc.problem or exc.context or "invalid YAML"
        raise UserError(f"{path}: YAML syntax error{where}: {problem}") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: YAML error: {str(exc).splitlines()[0]}") from None
    except RecursionError:
        raise UserError(f"{path}: YAML nests too deeply (recursive anchors?)") from None

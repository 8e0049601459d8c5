"""The RL Zoo's config.yml / args.yml beside an SB3 agent: the environment it was trained in, read as data.

The Zoo saves its hyperparameters (OrderedDicts dumped with python tags) next to the zip, or in a
folder named after it. Read by a SafeLoader that builds no object: env_kwargs (gymnasium.make's
keyword arguments), env_wrapper (names of wrapper classes, with their kwargs) and frame_stack. An
Atari agent's AtariWrapper is port/sb3.py's (zoo_atari); any other agent gets the rest as its
recipe's env block (zoo_env): the kwargs, the wrappers as env.wrappers (imported and applied only
if they are gymnasium.Wrapper subclasses, envs/user_env.py). The command line's --set env.* wins.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import yaml
from pydantic import JsonValue

from compress_dqn.errors import UserError
from compress_dqn.recipe.schema import EnvConfig

ATARI_WRAPPER = "stable_baselines3.common.atari_wrappers.AtariWrapper"
_MAX_ZOO_FILE = 1 << 20


class _ZooLoader(yaml.SafeLoader):
    """The RL Zoo's YAML (OrderedDicts dumped with python tags) as plain data; no object is built."""


def _python_tag(loader: _ZooLoader, suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.SequenceNode):
        items = loader.construct_sequence(node, deep=True)
        if suffix.endswith("collections.OrderedDict"):  # [[pairs]]: the dumped items
            pairs = items[0] if len(items) == 1 and isinstance(items[0], list) else items
            return {key: value for key, value in pairs}
        return items
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node, deep=True)
    return loader.construct_scalar(node)


_ZooLoader.add_multi_constructor("tag:yaml.org,2002:python/", _python_tag)


def _zoo_document(text: str) -> JsonValue:
    """One YAML document read by _ZooLoader, a SafeLoader: what yaml.load does, with no way to pass it
    an unsafe loader (the package's rule is safe loading only; tests check every loader is a SafeLoader)."""
    loader = _ZooLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def _zoo_yaml(path: Path) -> dict[str, JsonValue]:
    """A config.yml / args.yml as the raw document it holds ({} for one that is no mapping)."""
    try:
        data = path.read_bytes()
        if len(data) > _MAX_ZOO_FILE:
            raise UserError(f"baseline.from: {path}: over 1 MiB; not an RL Zoo config")
        loaded = _zoo_document(data.decode("utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError, TypeError, ValueError) as exc:
        raise UserError(f"baseline.from: {path}: not a readable RL Zoo file ({str(exc).splitlines()[0][:100]}); "
                        "remove it or save it again") from None
    return loaded if isinstance(loaded, dict) else {}


def _wrappers(value: JsonValue) -> list[tuple[str, dict[str, JsonValue]]]:
    """env_wrapper as (name, kwargs) pairs: the Zoo writes a name, a list of names, or {name: kwargs} items."""
    items = value if isinstance(value, list) else [value]
    pairs = []
    for item in items:
        if isinstance(item, dict):
            pairs += [(str(name), dict(kwargs or {})) for name, kwargs in item.items()]
        elif item is not None:
            pairs.append((str(item), {}))
    return pairs


class ZooConfig(NamedTuple):
    """What the Zoo's files beside a zip say; empty when there are none."""

    files: list[Path]
    wrappers: list[tuple[Path, str, dict[str, JsonValue]]]
    """env_wrapper entries in order: (the file that names it, class name, kwargs)."""
    frame_stack: JsonValue
    """frame_stack as written (None: not written)."""
    env_kwargs: JsonValue
    """env_kwargs for gymnasium.make, as written (None: not written)."""
    source: str
    """Where the settings came from, for the notes."""


def read_zoo(path: Path) -> ZooConfig:
    """config.yml / args.yml beside the zip `path` or in the folder named after it; where several say
    frame_stack or env_kwargs, the last one read (args.yml, then the folder's) wins."""
    files = [d / name for d in (path.parent, path.parent / path.stem) for name in ("config.yml", "args.yml")]
    found = [f for f in files if f.is_file()]
    wrappers: list[tuple[Path, str, dict[str, JsonValue]]] = []
    frame_stack: JsonValue = None
    env_kwargs: JsonValue = None
    for file in found:
        data = _zoo_yaml(file)
        hyper = data.get("hyperparams") if isinstance(data.get("hyperparams"), dict) else {}
        for source in (data, hyper):
            wrappers += [(file, name, kwargs) for name, kwargs in _wrappers(source.get("env_wrapper"))]
            if source.get("frame_stack") not in (None, {}):
                frame_stack = source["frame_stack"]
            if source.get("env_kwargs") not in (None, {}):
                env_kwargs = source["env_kwargs"]
    source = f"as {', '.join(f.name for f in found)} beside the zip say" if found else "a bare zip"
    return ZooConfig(found, wrappers, frame_stack, env_kwargs, source)


def zoo_env(path: Path, env_id: str, frame_stack: int) -> EnvConfig | None:
    """The env block of a (non-Atari) SB3 agent the Zoo's files describe: env_kwargs, env_wrapper as
    env.wrappers; None when there are no Zoo files. A frame_stack over 1 is refused: SB3's VecFrameStack
    concatenates flat observations, which this environment's stack (a new last axis) is not."""
    zoo = read_zoo(path)
    if not zoo.files:
        return None
    if zoo.frame_stack not in (None, False, 0, 1):
        raise UserError(f"baseline.from: {path}: the RL Zoo config says frame_stack {zoo.frame_stack}; SB3's "
                        "VecFrameStack of flat observations (frames concatenated) is not reproduced")
    kwargs: dict[str, JsonValue] = dict(zoo.env_kwargs) if isinstance(zoo.env_kwargs, dict) else {}
    wrappers: list[Any] = [{"class": name, "kwargs": dict(args)} if args else name for _, name, args in zoo.wrappers]
    try:
        return EnvConfig(id=env_id, kwargs=kwargs, wrappers=wrappers, frame_stack=frame_stack)
    except ValueError as exc:
        raise UserError(f"baseline.from: {path}: {zoo.source}: {str(exc).splitlines()[-1][:200]}") from None

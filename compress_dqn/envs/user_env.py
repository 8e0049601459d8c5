"""Environments from the user's own code: `package.module:Id` ids and the wrappers of env.wrappers.

An id `package.module:Id` is gymnasium's own form: the module is imported (which registers Id) and
Id is looked up. Every process that builds the environment imports it again (pool workers, look
workers, Ray tasks), so the module must be importable there: installed, or its folder on PYTHONPATH.
Importing a module runs its code; that is what naming it asks for.

A wrapper is named `package.module:Class` (or the RL Zoo's dotted `package.module.Class`): the
module is imported, the attribute looked up, and only a subclass of gymnasium.Wrapper is called;
anything else (a function, a builtin such as os:system, a class of another kind) is refused before
any call. The modules imported are remembered so that Ray tasks can be given them (executors.py).
"""

from __future__ import annotations

import difflib
import importlib
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym

from compress_dqn.errors import UserError
from compress_dqn.recipe.env import split_env_id, wrapper_parts

DEFAULT_MAX_EPISODE_STEPS = 10_000
"""The time limit of an environment registered without one (env.max_episode_steps overrides it): without
it an episode that never ends would hang evaluation."""

_IMPORTED: dict[str, str] = {}
"""The user modules imported in this process for env ids and wrappers, each with the sys.path folder it came from."""


def imported_modules() -> dict[str, str]:
    """Module name -> the folder on sys.path it was imported from, for every user module imported so far."""
    return dict(_IMPORTED)


def _folder(module: Any, name: str) -> str | None:
    """The sys.path entry a module was found under (a/b/c.py or a/b/c/__init__.py for a.b.c)."""
    file = getattr(module, "__file__", None)
    if not file:
        return None
    depth = len(name.split(".")) - 1 + (1 if hasattr(module, "__path__") else 0)
    return str(Path(file).resolve().parents[depth])


def import_user_module(module: str, what: str) -> Any:
    """Import `module` for `what` (a key and value, for the message); one line when it cannot be imported."""
    try:
        imported = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and (module == exc.name or module.startswith(exc.name + ".")):
            raise UserError(f"{what}: cannot import module {module!r} ({exc}); install it, or add the folder that "
                            "holds it to PYTHONPATH (every process that builds the environment imports it, a "
                            "resumed run too)") from None
        raise UserError(f"{what}: importing module {module!r} failed: it needs {exc.name!r}, which is not "
                        "installed") from None
    except Exception as exc:  # the user's module raised while it ran
        reason = (str(exc).strip().splitlines() or [""])[0]
        raise UserError(f"{what}: importing module {module!r} failed ({type(exc).__name__}: {reason}); "
                        "fix the module") from None
    folder = _folder(imported, module)
    installed = folder is None or Path(folder).name in ("site-packages", "dist-packages")
    if not installed and module.split(".")[0] not in sys.stdlib_module_names:  # the others are found anyway
        _IMPORTED.setdefault(module, folder)
    return imported


def import_env_module(env_id: str) -> None:
    """For `package.module:Id`: import the module and check that it registered Id (the gymnasium way)."""
    module, name = split_env_id(env_id)
    if module is None:
        return
    import_user_module(module, f"env.id: {env_id!r}")
    if name not in gym.envs.registry:
        close = difflib.get_close_matches(name, sorted(gym.envs.registry.keys()), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(f'{module}:{c}' for c in close)}?" if close else ""
        raise UserError(f"env.id: {env_id!r}: module {module!r} was imported but registers no environment "
                        f"{name!r} (gymnasium.register(id={name!r}, ...) when it is imported){hint}")


def wrapper_class(name: str) -> type[gym.Wrapper]:
    """The gymnasium.Wrapper subclass `name` names; anything else refused in one line before any call."""
    module, attribute = wrapper_parts(name)
    what = f"env.wrappers: {name!r}"
    found: Any = import_user_module(module, what)
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise UserError(f"{what}: module {module!r} has no {attribute!r}; name a gymnasium.Wrapper subclass")
        found = getattr(found, part)
    if not (isinstance(found, type) and issubclass(found, gym.Wrapper)):
        kind = f"class {found.__module__}.{found.__qualname__}" if isinstance(found, type) else type(found).__name__
        raise UserError(f"{what} is a {kind}, not a gymnasium.Wrapper subclass; only wrapper classes are applied "
                        "(nothing was called)")
    return found


def apply_wrappers(env: gym.Env, wrappers: list[Any]) -> gym.Env:
    """env wrapped by each of env.wrappers in order: a name, or {class, kwargs}."""
    classes = [(spec, wrapper_class(spec if isinstance(spec, str) else spec["class"])) for spec in wrappers]
    for spec, cls in classes:  # every name checked before the first is called
        kwargs = {} if isinstance(spec, str) else dict(spec.get("kwargs") or {})
        try:
            env = cls(env, **kwargs)
        except Exception as exc:
            env.close()
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            name = spec if isinstance(spec, str) else spec["class"]
            raise UserError(f"env.wrappers: {name!r} rejected the environment or its kwargs ({reason}); "
                            "fix env.wrappers") from None
    return env


def needs_time_limit(env: gym.Env) -> bool:
    """True for an environment registered without a time limit (its spec says none)."""
    spec = getattr(env, "spec", None)
    return spec is None or spec.max_episode_steps is None


def ray_runtime_env(remote: bool) -> dict[str, Any] | None:
    """The runtime_env Ray tasks need to import this process's user modules; None when there are none.

    Locally, their folders on the workers' PYTHONPATH; at a remote address, each module's top-level
    package (or single file) shipped as a py_module."""
    if not _IMPORTED:
        return None
    if remote:
        tops = sorted({name.split(".")[0] for name in _IMPORTED})
        return {"py_modules": [sys.modules[top] for top in tops]}
    import os

    folders = list(dict.fromkeys([*_IMPORTED.values(), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]))
    return {"env_vars": {"PYTHONPATH": os.pathsep.join(folders)}}

"""The observation and action spaces of an SB3 zip, from whichever SB3 release saved them, without running its code.

SB3 2.x (gymnasium) writes each space's readable fields beside its cloudpickle, the shape as
`_shape`; SB3 1.x (gym, the RL Zoo's 1.0rc0 zips included) names it `shape`; a zip whose `data`
keeps a space only as its cloudpickle has no readable fields at all. Readable fields are used
where there are any. Otherwise the pickle goes through the
restricted reader: gym's and gymnasium's space classes (and old gym's RandomState) become inert
records, numpy rebuilds arrays and dtypes, and any other global is refused in one line, so a zip
that asks for anything else runs nothing.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Any, NamedTuple

import numpy as np

from compress_dqn.errors import UserError
from compress_dqn.port.tensor_pickle import Inert, read_restricted_pickle

SPACE_MODULES = ("gym.spaces.", "gymnasium.spaces.", "numpy.random.")
"""What a pickled space may name besides numpy's rebuilders: the spaces, and old gym's RandomState."""


def readable(entry: Any, key: str, default: Any = None) -> Any:
    """A field of a `data` entry: plain JSON, or the readable text SB3 stores beside a cloudpickle."""
    if isinstance(entry, dict) and ":serialized:" in entry:
        value = entry.get(key, default)
        if isinstance(value, str) and key != "activation_fn" and key != "features_extractor_class":
            try:
                return json.loads(value.replace("'", '"').replace("True", "true").replace("False", "false"))
            except ValueError:
                return value
        return value
    return entry.get(key, default) if isinstance(entry, dict) else default


def numbers(text: Any) -> list[float]:
    """The numbers in a readable field (SB3 writes arrays as numpy's repr text)."""
    return [float(t) for t in re.findall(r"-?(?:inf|\d+\.?\d*(?:e[-+]?\d+)?)", str(text))]


class Spaces(NamedTuple):
    """What the policy was trained on: its Box observations and its number of Discrete actions."""

    obs_shape: tuple[int, ...]
    obs_dtype: str
    low: list[float]
    high: list[float]
    n_actions: int
    pickled: bool
    """True when read from the pickled spaces (a zip whose spaces have no readable fields)."""


def pickled_space(entry: Any, what: str, label: str) -> tuple[str, dict[str, Any]]:
    """The class name and fields of a space's cloudpickle, read by the restricted reader."""
    blob = entry.get(":serialized:") if isinstance(entry, dict) else None
    if not isinstance(blob, str):
        raise UserError(f"{label}: its data has no readable {what} and no pickled one; a damaged zip? "
                        "Save it again with SB3's model.save()")
    try:
        raw = base64.b64decode(blob, validate=True)
    except (binascii.Error, ValueError):
        raise UserError(f"{label}: its pickled {what} is not base64; a damaged zip?") from None
    loaded = read_restricted_pickle(raw, f"{label} ({what})", SPACE_MODULES)
    state = getattr(loaded, "state", None)
    if isinstance(state, tuple):  # (dict, slots) of a class with __slots__
        state = next((part for part in state if isinstance(part, dict)), None)
    if not isinstance(loaded, Inert) or not loaded.global_name.startswith(SPACE_MODULES[:2]) or not isinstance(state, dict):
        raise UserError(f"{label}: its pickled {what} is a {getattr(loaded, 'global_name', '') or type(loaded).__name__}, "
                        "not a gym or gymnasium space; save it again with SB3's model.save()")
    return loaded.global_name, state


def _floats(value: Any) -> list[float]:
    return np.asarray(value, dtype=np.float64).ravel().tolist() if value is not None else []


def read_spaces(data: dict[str, Any], label: str) -> Spaces:
    """The spaces of a zip's `data`: readable fields (`_shape` of SB3 2.x, `shape` of 1.x), else the pickles."""
    obs, actions = data.get("observation_space", {}), data.get("action_space", {})
    shape = readable(obs, "_shape")
    shape = readable(obs, "shape") if shape is None else shape
    pickled = shape is None
    if pickled:
        obs_kind, fields = pickled_space(obs, "observation space", label)
        shape = fields.get("_shape", fields.get("shape"))
        dtype, low, high = np.dtype(fields.get("dtype", "float32")).name, _floats(fields.get("low")), _floats(fields.get("high"))
    else:
        obs_kind = str(obs.get(":type:", "Box")) if isinstance(obs, dict) else "?"
        dtype = str(readable(obs, "dtype", ""))
        low, high = numbers(readable(obs, "low", "")), numbers(readable(obs, "high", ""))
    if "Box" not in obs_kind:
        raise UserError(f"{label}: its observation space is {obs_kind}; only Box observations are ported")
    try:
        obs_shape = tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        obs_shape = ()
    if not obs_shape or min(obs_shape) < 1:
        raise UserError(f"{label}: its observation space has shape {shape!r}, no Box shape; a damaged zip? "
                        "Save it again with SB3's model.save()")
    act_kind = str(actions.get(":type:", "Discrete")) if isinstance(actions, dict) else "?"
    n = readable(actions, "n")
    if n is None and "Discrete" in act_kind:
        act_kind, fields = pickled_space(actions, "action space", label)
        n = fields.get("n")
    if "Discrete" not in act_kind:
        raise UserError(f"{label}: its action space is {act_kind}; DQN needs Discrete")
    counts = numbers(n)
    if not counts or counts[0] < 1:
        raise UserError(f"{label}: its Discrete action space has n = {n!r}; a damaged zip?")
    return Spaces(obs_shape, dtype, low, high, int(counts[0]), pickled)

"""Playing a policy through the TFLite Micro interpreter, batch 1, as a microcontroller runs it.

On int8 policies its actions equal LiteRT's builtin kernels bit for bit, not always XNNPACK's
(LiteRT's default), which requantizes in float and can round a small action gap the other way.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from compress_dqn.deploy.micro.model import (
    ModelInfo, failure_reason, generous_arena, inspect_model, native_stderr, new_interpreter,
)
from compress_dqn.deploy.micro.uint8_input import runnable_model
from compress_dqn.deploy.tflite.reader import SIGNATURE, read_tflite
from compress_dqn.deploy.tflite.metadata import caller_normalization
from compress_dqn.errors import UserError


class MicroPolicy:
    """A .tflite policy run by the TFLite Micro interpreter, batch 1, as a microcontroller runs it.

    Same interface as `compress_dqn.deploy.litert.policy.TFLitePolicy`: obs_shape, n_actions, q_values(batch),
    actions(batch), act(obs). Batches are played one observation at a time (TFLM shapes are fixed).
    A raw uint8 observation's CAST is rewritten first, as `export --target micro` does (uint8_input.py).
    """

    def __init__(self, path: str | Path | bytes, arena_bytes: int | None = None, label: str | None = None,
                 info: ModelInfo | None = None) -> None:
        """label: what messages call bytes passed in (their file), instead of `<bytes>`; info: the
        inspection of bytes already runnable (uint8_input.runnable_model's), not read again."""
        data, read_label = read_tflite(path)
        label = label or read_label
        if info is None:
            data, info = runnable_model(data, inspect_model(data, label), label)
        if info.n_inputs != 1 or not {"q_values", "action"} <= set(info.outputs):
            raise UserError(f"{label}: signature {SIGNATURE!r} maps {info.n_inputs} input(s) -> {sorted(info.outputs)}; "
                            "expected one observation input -> q_values, action (export it with compress-dqn)")
        self._data = data  # TFLM reads the flatbuffer in place: keep it alive
        self._interp = new_interpreter(data, arena_bytes or generous_arena(data), label)
        self.ops = info.ops
        details = self._interp.get_input_details(0)
        self._shape = tuple(int(d) for d in details["shape"])
        self.obs_shape = self._shape[1:]
        self.input_dtype = np.dtype(details["dtype"])
        self.input_quantization = _quant(details)
        self.quantized_input = self.input_quantization is not None and self.input_dtype.kind in "iu"
        # A raw uint8 observation (scale 1, zero point 0 after uint8_input_model): the caller passes it unchanged.
        self.raw_input = self.input_dtype == np.uint8 and self.input_quantization in (None, (1.0, 0))
        # (mean, std) an int8-input policy's caller applies, or None; a float-input one has it in its graph.
        self.input_normalization = caller_normalization(data, label, int(np.prod(self.obs_shape)), self.quantized_input)
        self.q_index, self.action_index = info.outputs["q_values"], info.outputs["action"]
        q_details = self._interp.get_output_details(self.q_index)
        self.n_actions = int(q_details["shape"][-1])
        self.q_quantization = _quant(q_details)
        self._set, self._invoke, self._get = self._interp.set_input, self._interp.invoke, self._interp.get_output
        with native_stderr() as lines:  # one invoke now: a model TFLM cannot run fails here, in one line
            try:
                self._run(np.zeros(self.obs_shape, np.float32))
                error = None
            except Exception as exc:
                error = exc
        if error is not None:
            raise UserError(f"{label}: {failure_reason(lines, error)}")

    def _prepare(self, obs: np.ndarray) -> np.ndarray:
        if self.input_normalization is not None:  # as TFLitePolicy does: the caller of an int8 input normalizes
            obs = self.input_normalization.apply(obs)
        if self.quantized_input:  # as TFLitePolicy does, so both runtimes see the same integers
            scale, zero_point = self.input_quantization
            info = np.iinfo(self.input_dtype)
            obs = np.clip(np.round(np.asarray(obs, np.float32) / scale + zero_point), info.min, info.max)
        return np.ascontiguousarray(np.asarray(obs).reshape(self._shape), dtype=self.input_dtype)

    def _run(self, obs: np.ndarray) -> None:
        self._set(self._prepare(obs), 0)
        self._invoke()

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        rows = []
        for one in np.asarray(obs):
            self._run(one)
            rows.append(np.array(self._get(self.q_index)).reshape(-1))
        q = np.stack(rows) if rows else np.zeros((0, self.n_actions))
        if self.q_quantization is not None and q.dtype.kind in "iu":
            scale, zero_point = self.q_quantization
            q = (q.astype(np.float32) - zero_point) * scale
        return np.asarray(q, dtype=np.float32)

    def actions(self, obs: np.ndarray) -> np.ndarray:
        """The greedy actions for a batch (the `action` output, which is what the device plays)."""
        out = []
        for one in np.asarray(obs):
            self._run(one)
            out.append(int(self._get(self.action_index).reshape(-1)[0]))
        return np.array(out, dtype=np.int32)

    def act(self, obs: np.ndarray) -> int:
        self._run(obs)
        return int(self._get(self.action_index).reshape(-1)[0])


def _quant(details: dict) -> tuple[float, int] | None:
    """Per-tensor (scale, zero point) of an io tensor, or None for a float one."""
    params = details.get("quantization_parameters") or {}
    scales, zero_points = params.get("scales", []), params.get("zero_points", [])
    if len(scales) == 0 or float(scales[0]) == 0.0:
        return None
    return float(scales[0]), int(zero_points[0]) if len(zero_points) else 0


def probe_observations(policy: MicroPolicy, n: int = 256) -> np.ndarray:
    rng = np.random.default_rng(0)
    if policy.quantized_input:  # every point of the input grid is a valid observation
        scale, zero_point = policy.input_quantization
        info = np.iinfo(policy.input_dtype)
        return ((rng.integers(info.min, info.max + 1, size=(n, *policy.obs_shape)) - zero_point) * scale).astype(np.float32)
    if policy.input_dtype.kind in "iu":  # raw integer observations (pixels)
        return rng.integers(0, 256, size=(n, *policy.obs_shape)).astype(policy.input_dtype)
    return rng.normal(0, 2, size=(n, *policy.obs_shape)).astype(np.float32)


def same_outputs(original: bytes, candidate: bytes, label: str) -> bool:
    """Whether TFLM gives identical q-values and actions for both models on probe observations."""
    before, after = MicroPolicy(original), MicroPolicy(candidate)
    if before.obs_shape != after.obs_shape or before.n_actions != after.n_actions:
        return False
    obs = probe_observations(before)
    return bool(np.array_equal(before.q_values(obs), after.q_values(obs))
                and np.array_equal(before.actions(obs), after.actions(obs)))



"""Runtime policy loaders with one interface: `act(obs) -> int` and `q_values(batch)`.

`TFLitePolicy` runs on `ai_edge_litert` alone and never imports TensorFlow: a deployed TFLite
policy should cost megabytes, not the ~700 MB of a TensorFlow process. The SavedModel runtime
lives in compress_dqn.convert.saved_model, a package that may import TensorFlow.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np

from compress_dqn._quiet import quiet_stderr
from compress_dqn.deploy.tflite.metadata import caller_normalization
from compress_dqn.deploy.tflite.reader import SIGNATURE, read_tflite, unreadable
from compress_dqn.errors import UserError


class Policy(Protocol):
    """What evaluation and measurement need from a policy artifact."""

    obs_shape: tuple[int, ...]
    n_actions: int

    def q_values(self, obs: np.ndarray) -> np.ndarray: ...
    def actions(self, obs: np.ndarray) -> np.ndarray: ...
    def act(self, obs: np.ndarray) -> int: ...


class TFLitePolicy:
    """A .tflite policy run by the LiteRT interpreter (XNNPACK on CPU)."""

    def __init__(self, path: str | Path | bytes, num_threads: int = 1, reference_kernels: bool = False,
                 keep_tensors: bool = False) -> None:
        """path: a .tflite file, or the flatbuffer bytes themselves (checked before writing one).
        reference_kernels: LiteRT's reference kernels instead of XNNPACK's (whose int8 rounding may
        differ): what `export --target c` computes, action for action.
        keep_tensors: every intermediate tensor stays readable after a call (`tensor`), at the memory
        of all of them at once."""
        content, label = read_tflite(path)
        from ai_edge_litert.interpreter import Interpreter, OpResolverType

        resolver = OpResolverType.BUILTIN_REF if reference_kernels else OpResolverType.AUTO
        try:
            with quiet_stderr():
                self._interp = Interpreter(model_content=content, num_threads=num_threads,
                                           experimental_op_resolver_type=resolver,
                                           experimental_preserve_all_tensors=keep_tensors)
        except (ValueError, RuntimeError) as exc:
            raise unreadable(label, str(exc)) from None
        path = self._label = label
        signatures = self._interp.get_signature_list()
        if SIGNATURE not in signatures:
            raise UserError(f"{path}: no {SIGNATURE!r} signature (has {sorted(signatures)}); export it with compress-dqn")
        runner = self._interp.get_signature_runner(SIGNATURE)
        inputs, outputs = runner.get_input_details(), runner.get_output_details()
        if len(inputs) != 1 or not {"q_values", "action"} <= set(outputs):
            raise UserError(
                f"{path}: signature {SIGNATURE!r} maps {sorted(inputs)} -> {sorted(outputs)}; "
                "expected one observation input -> q_values, action"
            )
        del runner  # it holds views into the interpreter, which would block resizing
        self._in = next(iter(inputs.values()))
        self._q = outputs["q_values"]
        self._action = outputs["action"]
        self.obs_shape = tuple(int(d) for d in self._in["shape_signature"][1:])
        self.n_actions = int(self._q["shape_signature"][-1])
        self.input_dtype = np.dtype(self._in["dtype"])
        self._native_dtype = np.dtype(self.input_dtype.type)  # numpy's shared native instance: act() tests it with `is`
        self.quantized_input = bool(self._in["quantization"][0]) and self.input_dtype.kind in "iu"
        # Only an int8-input policy leaves its normalization to the caller: a float one has it in its graph.
        self.input_normalization = caller_normalization(content, label, int(np.prod(self.obs_shape)), self.quantized_input)
        self._needs_prepare = self.quantized_input or self.input_normalization is not None
        self._one_shape = (1, *self.obs_shape)
        self._fast = False  # act() may hand the observation to LiteRT as it is (batch 1, nothing to prepare)
        self._in_index, self._action_index = self._in["index"], self._action["index"]
        # Bound methods of the Python wrapper: they do not pin the interpreter's buffers.
        self._set_tensor, self._get_tensor, self._invoke = self._interp.set_tensor, self._interp.get_tensor, self._interp.invoke
        self._batch = 0
        self._resize(1)

    def _resize(self, batch: int) -> None:
        if batch != self._batch:
            from compress_dqn._quiet import quiet_stderr

            self._interp.resize_tensor_input(self._in["index"], [batch, *self.obs_shape])
            try:
                with quiet_stderr():  # XNNPACK announces itself on stderr at allocation
                    self._interp.allocate_tensors()
            except RuntimeError as exc:  # an op LiteRT lacks, or one whose Prepare fails
                reason = (str(exc).strip().splitlines() or ["RuntimeError"])[0]
                hint = ("; it was exported for TFLite Micro (--compress): play it with --runtime micro"
                        if "TFLM_DECODE" in str(exc) else "; re-export it with compress-dqn export")
                raise UserError(f"{self._label}: the TFLite runtime cannot prepare it ({reason}){hint}") from None
            self._batch = batch
            self._fast = batch == 1 and not self._needs_prepare

    def _prepare(self, obs: np.ndarray) -> np.ndarray:
        if self.input_normalization is not None:  # the policy takes (obs - mean) / std
            obs = self.input_normalization.apply(obs)
        if self.quantized_input:  # full-integer model: quantize the input
            scale, zero_point = self._in["quantization"]
            info = np.iinfo(self.input_dtype)
            obs = np.clip(np.round(np.asarray(obs, np.float32) / scale + zero_point), info.min, info.max)
        return np.ascontiguousarray(obs, dtype=self.input_dtype)

    def _run(self, obs: np.ndarray) -> None:
        if len(obs) != self._batch:
            self._resize(len(obs))
        ready = not self._needs_prepare and obs.dtype == self.input_dtype and obs.flags.c_contiguous
        self._set_tensor(self._in_index, obs if ready else self._prepare(obs))
        self._invoke()

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        self._run(np.asarray(obs))
        q = self._interp.get_tensor(self._q["index"])
        scale, zero_point = self._q["quantization"]
        if scale and q.dtype.kind in "iu":
            q = (q.astype(np.float32) - zero_point) * scale
        return np.asarray(q, dtype=np.float32)

    def actions(self, obs: np.ndarray) -> np.ndarray:
        """The policy's greedy actions for a batch (its `action` output, which is what it plays), one
        interpreter call for the batch. LiteRT's kernels compute each row of a batch as they compute
        it alone (tests/test_play_batched.py compares them bit for bit), so row i is act(obs[i])."""
        self._run(np.asarray(obs))
        return self._get_tensor(self._action_index)  # a copy: the interpreter's buffer is not exposed

    def tensor(self, index: int) -> np.ndarray:
        """A tensor of the last call by its index in the file (an intermediate one needs keep_tensors)."""
        return self._interp.get_tensor(index)

    def act(self, obs: np.ndarray) -> int:
        # The per-step hot path: LiteRT's own set+invoke+get is a few microseconds. This adds a view (obs[None])
        # and no check of its own: set_tensor refuses a wrong dtype or shape (ValueError), and
        # anything not an array of the input's dtype and shape takes _act_slowly.
        if self._fast and getattr(obs, "dtype", None) is self._native_dtype:  # set_tensor copies bytes as they are
            try:
                self._set_tensor(self._in_index, obs[None])
            except (ValueError, TypeError, IndexError, KeyError):
                return self._act_slowly(obs)
            self._invoke()
            return self._get_tensor(self._action_index).item()
        return self._act_slowly(obs)

    def _act_slowly(self, obs: np.ndarray) -> int:
        if self._batch != 1:
            self._resize(1)
        if self._needs_prepare or getattr(obs, "dtype", None) != self.input_dtype:
            obs = self._prepare(obs)
        self._set_tensor(self._in_index, np.asarray(obs).reshape(self._one_shape))
        self._invoke()
        return int(self._get_tensor(self._action_index)[0])


def check_compatible(policy: Policy, obs_shape: tuple[int, ...], n_actions: int, env_id: str, source: str) -> None:
    """Refuse a policy whose observation or action sizes do not match the environment."""
    if tuple(policy.obs_shape) != tuple(obs_shape):
        raise UserError(
            f"{source}: policy expects observations of shape {tuple(policy.obs_shape)} but {env_id} gives "
            f"{tuple(obs_shape)}; pass the environment the policy was trained on"
        )
    if policy.n_actions != n_actions:
        raise UserError(f"{source}: policy has {policy.n_actions} actions but {env_id} has {n_actions}")

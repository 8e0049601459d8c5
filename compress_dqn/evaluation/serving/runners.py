"""The device side of `bench --device`: an exported ONNX policy on torch (CUDA or CPU) or on onnxruntime's CUDA provider.

Each runner gives serving.py the same things: the actions of a batch, one call at a batch (its result
waited for), a CUDA-graph replay of that call where the runtime has graphs, the policy's own device
memory at its peak, and what the runtime's context costs (NVML, where nvidia-ml-py is installed).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from compress_dqn.deploy.onnx.torch_runtime import INTEGER_NOTE, OnnxTorchPolicy

NO_NVML = "not read: NVML needs nvidia-ml-py (pip install nvidia-ml-py)"


def _nvml_used(uuid: str | None = None) -> tuple[int | None, str | None, str | None]:
    """(device memory in use, driver version, the GPU's name) from NVML; (None, None, why) where it cannot be read."""
    try:
        import pynvml
    except ImportError:
        return None, None, NO_NVML
    try:
        pynvml.nvmlInit()
        handle = (pynvml.nvmlDeviceGetHandleByUUID(uuid) if uuid else pynvml.nvmlDeviceGetHandleByIndex(0))
        return (int(pynvml.nvmlDeviceGetMemoryInfo(handle).used), str(pynvml.nvmlSystemGetDriverVersion()),
                str(pynvml.nvmlDeviceGetName(handle)))
    except Exception as exc:  # NVML's own error classes: no driver, no such device
        return None, None, f"not read: NVML: {exc}"


class TorchRunner:
    """The ONNX interpreter on a torch device; on CUDA with TF32 off, graphs captured per batch, allocator counts."""

    def __init__(self, model: Any, device: str, path: Path) -> None:
        import torch

        self.torch, self.cuda = torch, device != "cpu"
        self.device, self.runtime = ("cuda" if self.cuda else "cpu"), f"torch {torch.__version__} (ONNX interpreter)"
        self.note = f"{INTEGER_NOTE}; torch threads {torch.get_num_threads()}"
        self.context_bytes = self.context_note = self.memory_note = self.graph_note = None
        if self.cuda:
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
            self._open_context()
        else:
            self.machine = ("cpu", None, None)
            self.context_note = self.memory_note = "not measured: the CPU device has no device memory of its own"
            self.graph_note = "the CPU device has no CUDA graphs"
        self.base = torch.cuda.memory_allocated() if self.cuda else 0
        self.policy = OnnxTorchPolicy(model, self.device, str(path))
        self.weights_bytes = self.policy.weights_bytes
        self.obs_shape, self.input_dtype = self.policy.obs_shape, self.policy.input_dtype

    def _open_context(self) -> None:
        """Create the CUDA context, with NVML's count of the device memory it took (the allocator's pool excluded)."""
        torch = self.torch
        props = torch.cuda.get_device_properties(0)
        uuid = f"GPU-{props.uuid}" if getattr(props, "uuid", None) else None
        before, driver, why = _nvml_used(uuid)
        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
        after, _, _ = _nvml_used(uuid)
        if before is None or after is None:
            self.context_note = why
        else:
            self.context_bytes = after - before - torch.cuda.memory_reserved()
            self.context_note = "NVML: device memory in use after creating the CUDA context, less before and less torch's pool"
        self.machine = (props.name, torch.version.cuda, driver)

    def _input(self, states: np.ndarray) -> Any:
        return self.torch.from_numpy(np.ascontiguousarray(states)).to(self.device)

    def _sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def actions(self, states: np.ndarray) -> np.ndarray:
        return self.policy.actions(states)

    def eager(self, states: np.ndarray) -> Callable[[], None]:
        x, forward, sync = self._input(states), self.policy.forward, self._sync

        def call() -> None:
            forward(x)
            sync()
        return call

    def graph(self, states: np.ndarray) -> Callable[[], None] | None:
        """One call captured as a CUDA graph, replayed: the launch-bound floor, without Python's per-op cost."""
        if not self.cuda:
            return None
        torch, x = self.torch, self._input(states)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                self.policy.forward(x)
        torch.cuda.current_stream().wait_stream(side)
        captured = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(captured):
                self.policy.forward(x)
        except RuntimeError as exc:  # an op that reads device memory on the host cannot be captured: eager figures only
            self.graph_note = f"torch captured no CUDA graph: {str(exc).splitlines()[0][:200]}"
            return None

        def call() -> None:
            captured.replay()
            torch.cuda.synchronize()
        return call

    def peak_bytes(self, states: np.ndarray) -> int | None:
        """The allocator's peak over one call, counted from before the policy was loaded."""
        if not self.cuda:
            return None
        call = self.eager(states)
        self.torch.cuda.reset_peak_memory_stats()
        call()
        return int(self.torch.cuda.max_memory_allocated() - self.base)


class OrtCudaRunner:
    """onnxruntime's CUDA provider, inputs and outputs bound on the device; a CUDA-graph session per batch."""

    def __init__(self, model: Any, path: Path) -> None:
        import onnxruntime as ort

        self.ort, self.path, self.device = ort, str(path), "cuda"
        self.runtime = f"onnxruntime {ort.__version__} CUDAExecutionProvider"
        self.note = "onnxruntime's CUDA kernels (ops it has no CUDA kernel for run on its CPU provider)"
        before, driver, why = _nvml_used()
        self.session = self._session({})
        after, _, name = _nvml_used()
        self.context_bytes = None if before is None or after is None else after - before
        self.context_note = why if self.context_bytes is None else (
            "NVML: device memory in use after opening the session (CUDA context, onnxruntime's arena and the weights), less before")
        self.memory_note = "not measured: onnxruntime's CUDA arena keeps no count of a call's peak"
        self.graph_note, self.weights_bytes = None, None
        self.machine = (name if before is not None else "CUDA GPU", None, driver)
        self.input = self.session.get_inputs()[0]
        self.obs_shape = tuple(self.input.shape[1:])
        self.input_dtype = np.dtype(np.uint8 if "uint8" in self.input.type else np.float32)

    def _session(self, options: dict[str, str]) -> Any:
        return self.ort.InferenceSession(self.path, providers=[("CUDAExecutionProvider", options), "CPUExecutionProvider"])

    def actions(self, states: np.ndarray) -> np.ndarray:
        return self.session.run(["action"], {self.input.name: states})[0]

    def _bound(self, session: Any, states: np.ndarray) -> Callable[[], None]:
        binding = session.io_binding()
        binding.bind_ortvalue_input(self.input.name, self.ort.OrtValue.ortvalue_from_numpy(states, "cuda", 0))
        out = self.ort.OrtValue.ortvalue_from_shape_and_type([len(states)], np.int32, "cuda", 0)
        binding.bind_ortvalue_output("action", out)

        def call() -> None:
            session.run_with_iobinding(binding)
            binding.synchronize_outputs()
        return call

    def eager(self, states: np.ndarray) -> Callable[[], None]:
        return self._bound(self.session, states)

    def graph(self, states: np.ndarray) -> Callable[[], None] | None:
        try:
            call = self._bound(self._session({"enable_cuda_graph": "1"}), states)
            call()  # the first run captures
        except Exception as exc:  # onnxruntime refuses graphs where a node runs on its CPU provider
            self.graph_note = f"onnxruntime captured no CUDA graph: {str(exc).splitlines()[0][:200]}"
            return None
        return call

    def peak_bytes(self, states: np.ndarray) -> int | None:
        return None


def open_runner(runtime: str, device: str, model: Any, path: Path) -> TorchRunner | OrtCudaRunner:
    """The runner serving.choose_runtime picked."""
    return OrtCudaRunner(model, path) if runtime == "ort-cuda" else TorchRunner(model, device, path)

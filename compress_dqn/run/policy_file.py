"""`evaluate` and `bench` on one policy file: loading it, fitting the environment to its input and
drawing observations for it happen here, below the command line. A .tflite never imports
TensorFlow on this path (convert.loading loads a SavedModel's runtime only for a directory)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel

from compress_dqn.deploy.litert.policy import Policy, TFLitePolicy, check_compatible
from compress_dqn.deploy.tflite.reader import read_tflite
from compress_dqn.envs.environment import EnvInfo, probe_env
from compress_dqn.evaluation.figures import ReturnStats
from compress_dqn.evaluation.measure import compare_with_litert, dir_bytes, gzip_bytes, measure_latency, measure_memory
from compress_dqn.evaluation.play import evaluate
from compress_dqn.convert.loading import load_policy
from compress_dqn.recipe.schema import EnvConfig, env_from_data
from compress_dqn.store.manifest import check_artifact


def env_for_policy(policy: Policy, env_id: str, overrides: tuple[str, ...] = ()) -> tuple[EnvConfig, EnvInfo]:
    """env_id (with the env.* overrides: kwargs, time limit, wrappers) as the policy plays it: a policy
    trained on stacked frames (one more input axis than the environment's observation, the last) gets
    that many frames stacked."""
    env = env_from_data({"id": env_id}, overrides)
    info = probe_env(env)
    shape = tuple(policy.obs_shape)
    if len(shape) == len(info.obs_shape) + 1 and shape[:-1] == info.obs_shape and shape[-1] > 1:
        env = env.model_copy(update={"frame_stack": shape[-1]})
        info = probe_env(env)
    return env, info


def evaluate_policy_file(path: Path, env_id: str, episodes: int, seed: int, runtime: str,
                         overrides: tuple[str, ...] = ()) -> ReturnStats:
    """Greedy episodes of a .tflite file or SavedModel directory on seeds seed..seed+episodes-1;
    runtime "micro" plays a .tflite through the TFLite Micro interpreter."""
    check_artifact(path)
    if runtime == "micro":
        from compress_dqn.deploy.micro import MicroPolicy

        policy: Any = MicroPolicy(path)
    else:
        policy = load_policy(path)
    env, info = env_for_policy(policy, env_id, overrides)
    check_compatible(policy, info.obs_shape, info.n_actions, env_id, str(path))
    return evaluate(policy if isinstance(policy, TFLitePolicy) else policy.act, env, episodes, seed)


class BenchReport(BaseModel):
    """`bench` on one .tflite file or SavedModel directory, as it prints it."""

    policy: str
    runtime: str
    size: dict[str, Any]
    latency_us: dict[str, Any]
    litert_us: dict[str, Any] | None
    """Our act() beside LiteRT's bare invoke and set+invoke+get on the same file: the loader's overhead."""
    memory_bytes: dict[str, Any] | None


def bench_observations(policy: Any, count: int = 1000, seed: int = 0) -> np.ndarray:
    """Observations to time a policy on: pixel values for a raw integer input (images), normal
    floats for a float one or for an integer one the policy quantizes itself."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(policy.input_dtype)
    if dtype.kind in "iu" and not getattr(policy, "quantized_input", False):
        return rng.integers(0, 256, size=(count, *policy.obs_shape)).astype(dtype)
    return rng.normal(size=(count, *policy.obs_shape)).astype(np.float32)


def bench_policy_file(path: Path, calls: int, memory: bool) -> BenchReport:
    """Size, batch-1 latency (beside LiteRT's own for a .tflite) and, if asked, peak inference memory."""
    check_artifact(path)
    policy = load_policy(path)
    runtime = "tflite" if isinstance(policy, TFLitePolicy) else "saved_model"
    obs = bench_observations(policy)
    return BenchReport(
        policy=str(path), runtime=runtime,
        size={"bytes": dir_bytes(path), "gzip_bytes": gzip_bytes(path) if runtime == "tflite" else None},
        latency_us=measure_latency(policy, obs, calls=calls).to_dict(),
        litert_us=compare_with_litert(policy, read_tflite(path)[0], obs) if runtime == "tflite" else None,
        memory_bytes=measure_memory(path, runtime) if memory else None,
    )

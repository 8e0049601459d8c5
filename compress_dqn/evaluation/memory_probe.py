"""Run as `python -m compress_dqn.evaluation.memory_probe PATH STEPS`: load one TFLite policy with LiteRT
alone, act STEPS times, print JSON with the peak RSS. A fresh process per artifact, so the figure is
that runtime's cost alone; this process never imports TensorFlow (a SavedModel's probe is
compress_dqn.convert.saved_model_probe, which reuses `probe`)."""

from __future__ import annotations

import json
import resource
import sys
from collections.abc import Callable

import numpy as np
import psutil

from compress_dqn.deploy.litert.policy import Policy, TFLitePolicy


def _peak_rss_bytes() -> int:
    """This process image's peak RSS. Not ru_maxrss: on Linux that survives exec, so a probe
    forked from a TensorFlow process would report the parent's ~700 MB. VmHWM belongs to the
    current address space."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _current_rss_bytes() -> int:
    return psutil.Process().memory_info().rss


def probe(runtime: str, load: Callable[[str], Policy]) -> None:
    """Load the policy at argv[1] with `load`, act argv[2] times, print the JSON line measure_memory reads."""
    path, steps = sys.argv[1], int(sys.argv[2])
    before = _current_rss_bytes()  # interpreter + numpy + our package: the floor of any policy process
    policy = load(path)
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(steps, *policy.obs_shape)).astype(np.float32)
    for row in obs:
        policy.act(row)
    peak = _peak_rss_bytes()
    print(json.dumps({
        "runtime": runtime,
        "steps": steps,
        "process_baseline_rss": before,
        "peak_rss": peak,
        "policy_rss": peak - before,
        "imports_tensorflow": "tensorflow" in sys.modules,
    }))


if __name__ == "__main__":
    probe("tflite", TFLitePolicy)

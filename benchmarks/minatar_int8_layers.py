"""Which int8 component of a small CNN student flips its greedy actions, one component at a time.

    .venv/bin/python benchmarks/minatar_int8_layers.py \\
        --policy runs/mb/seed-0/variants/long-c8-32/policy.tflite \\
        --replay runs/mb/seed-0/baseline/replay.npz [--states 3000] [--seed 0]
    .venv/bin/python benchmarks/minatar_int8_layers.py --smoke     # a tiny random CNN of that shape: ~30 s

Why: a MinAtar student of 8 filters and 32 units plays its float32 baseline's return, and its int8
build does not. Its action gaps are tiny (a median of ~0.02 on replay states), so one int8 step of
some range is enough to tie or flip an action; this names the range. `--policy` is a float32
student written by compress-dqn (uint8 observations, CONV_2D + relu, flatten, a FULLY_CONNECTED
hidden layer + relu, then the split heads "advantage" (n_actions units) and "value" (1 unit),
Q = A + V). The weights are read from its graph (compress_dqn.deploy.tflite.graph), not by their
shapes, and its forward pass is redone in numpy, checked against LiteRT on the same states (the run
fails if the two differ by more than 1e-3). Then each component is quantized as TFLite's int8 does,
the rest left in float, and the greedy action compared with the float one on `--states` replay
states (rows of `--replay`'s obs, drawn with `--seed`):

- weights: symmetric int8 (scale = max|w| / 127), per output channel for the conv and the heads;
  the hidden Dense kernel per output unit or per tensor (one scale for the whole kernel);
- activations: asymmetric int8 over the range calibrated on these states with the float network
  ([0, max] after a relu; [min(lo, 0), max(hi, 0)] for each head's output);
- not modelled: the int32 biases (their scale is the input's times the weight's: far finer) and the
  uint8 input (MinAtar's 0/1 channels are exact).

How the rows map to recipe options: "hidden weights per tensor" is tfmot QAT's default for a Dense
kernel (one scale for the kernel); `quantize.per_channel_dense` gives it a scale per unit, the
"hidden weights per unit" row. "head weights" and "head outputs" are the int8 heads;
`quantize.float_head` keeps both in float, leaving the "body" rows (conv and hidden weights and
activations int8). "everything" is a full int8 model with per-unit hidden weights.

Prints a first JSON line with the policy, the states, the float check (numpy against LiteRT), the
median action gap (best minus second-best Q) and the calibrated activation ranges, then one line per
component or combination: {"quantized", "agreement" (share of states whose greedy action is the
float one's), "advantage_error" (mean |error| of Q - mean_a Q)}.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MAX_FLOAT_DIFFERENCE = 1e-3

ROWS: list[tuple[str, set[str], set[str]]] = [
    # (name, weights quantized, activations quantized)
    ("conv weights", {"conv"}, set()),
    ("hidden weights per unit", {"hidden"}, set()),
    ("hidden weights per tensor", {"hidden_tensor"}, set()),
    ("head weights", {"head"}, set()),
    ("conv activations", set(), {"conv"}),
    ("hidden activations", set(), {"hidden"}),
    ("head outputs", set(), {"head"}),
    ("body", {"conv", "hidden"}, {"conv", "hidden"}),
    ("body, hidden weights per tensor", {"conv", "hidden_tensor"}, {"conv", "hidden"}),
    ("everything", {"conv", "hidden", "head"}, {"conv", "hidden", "head"}),
]
"""What each printed row quantizes: the float network, but for these."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", type=Path, help="a float32 CNN student .tflite written by compress-dqn")
    parser.add_argument("--replay", type=Path, help="a replay.npz of the same game (its obs rows are the states)")
    parser.add_argument("--states", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny random float CNN of that shape and random 0/1 states, no run directory")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.smoke:
            args.states = min(args.states, 500)
            policy = smoke_policy(Path(tmp), args.seed)
            states = np.random.default_rng(args.seed).integers(0, 2, (args.states, 10, 10, 4), dtype=np.uint8)
        else:
            if args.policy is None or args.replay is None:
                parser.error("--policy and --replay are required (or --smoke)")
            policy, states = args.policy, replay_states(args.replay, args.states, args.seed)
        for line in study(policy, states):
            print(json.dumps(line), flush=True)


def replay_states(path: Path, count: int, seed: int) -> np.ndarray:
    """`count` distinct observations from a replay.npz's filled rows, drawn with `seed`."""
    with np.load(path) as data:
        obs = data["obs"]
        filled = int(data["size"]) if "size" in data.files else len(obs)
        filled = min(filled, len(obs))
        rows = np.sort(np.random.default_rng(seed).choice(filled, min(count, filled), replace=False))
        return obs[rows]


def smoke_policy(tmp: Path, seed: int) -> Path:
    """A random float32 student of the MinAtar shape (4 filters, 16 units: smaller, found by the
    graph all the same), split into advantage and value heads and exported as compress-dqn does."""
    from compress_dqn._tf import tf_keras
    from compress_dqn.compress.rewrites import split_value_advantage
    from compress_dqn.convert.conversion import convert_tflite, export_saved_model
    from compress_dqn.rl.networks import build_q_network

    tf_keras.utils.set_random_seed(seed)
    model = build_q_network((10, 10, 4), 3, [16], conv=[SimpleNamespace(filters=4, kernel=3, stride=1)],
                            name="smoke_student")
    split = split_value_advantage(model)
    saved = export_saved_model(split, (10, 10, 4), np.uint8, tmp / "saved_model")
    path = tmp / "policy.tflite"
    path.write_bytes(convert_tflite(saved))
    return path


class Network:
    """The student's weights, read from its graph, and its forward pass in float64 numpy."""

    def __init__(self, policy: Path) -> None:
        from compress_dqn.deploy.tflite.graph import read_policy_graph

        graph = read_policy_graph(policy, outputs=("action", "q_values"))
        kinds = [op.kind for op in graph.ops]
        unexpected = sorted(set(kinds) - {"CAST", "CONV_2D", "RESHAPE", "FULLY_CONNECTED", "ADD", "ARG_MAX"})
        if unexpected or graph.integer or graph.caller_normalization is not None:
            sys.exit(f"{policy}: not a float32 CNN student (ops {kinds}); this reads one conv, a hidden Dense "
                     "layer and the split heads")
        convs = [op for op in graph.ops if op.kind == "CONV_2D"]
        dense = [op for op in graph.ops if op.kind == "FULLY_CONNECTED"]
        if len(convs) != 1 or len(dense) != 3:
            sys.exit(f"{policy}: {len(convs)} CONV_2D and {len(dense)} FULLY_CONNECTED ops; this reads one conv, "
                     "one hidden layer and two heads")
        conv, hidden, heads = convs[0], dense[0], dense[1:]
        value = [op for op in heads if op.inputs[1].shape[0] == 1]
        if len(value) != 1 or conv.activation != "RELU" or hidden.activation != "RELU" or \
                any(op.activation != "NONE" for op in heads) or int(conv.options.get("padding", 0)) != 1:
            sys.exit(f"{policy}: expected a valid relu conv, a relu hidden layer and linear heads of which one "
                     "has one unit (the value)")
        advantage = next(op for op in heads if op is not value[0])

        def weights(op):
            bias = op.inputs[2].real() if len(op.inputs) > 2 and op.inputs[2] is not None else 0.0
            return op.inputs[1].real().astype(np.float64), np.asarray(bias, np.float64)

        self.conv_w, self.conv_b = weights(conv)  # (out, kh, kw, in)
        self.stride = (int(conv.options.get("strideH", 1)), int(conv.options.get("strideW", 1)))
        self.hidden_w, self.hidden_b = weights(hidden)  # (units, features)
        self.adv_w, self.adv_b = weights(advantage)
        self.value_w, self.value_b = weights(value[0])
        self.obs_shape = graph.obs_shape
        self.shapes = {"conv": list(self.conv_w.shape), "hidden": list(self.hidden_w.shape),
                       "advantage": list(self.adv_w.shape), "value": list(self.value_w.shape)}

    def conv(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        """A valid convolution of NHWC x with (out, kh, kw, in) w, the bias added."""
        _, kh, kw, _ = w.shape
        sh, sw = self.stride
        oh, ow = (x.shape[1] - kh) // sh + 1, (x.shape[2] - kw) // sw + 1
        out = np.zeros((len(x), oh, ow, w.shape[0]))
        for i in range(kh):
            for j in range(kw):
                patch = x[:, i:i + sh * (oh - 1) + 1:sh, j:j + sw * (ow - 1) + 1:sw, :]
                out += np.einsum("nhwc,oc->nhwo", patch, w[:, i, j, :])
        return out + self.conv_b

    def forward(self, obs: np.ndarray, weights: set[str] = frozenset(), acts: set[str] = frozenset(),
                ranges: dict[str, tuple[float, float]] | None = None) -> dict[str, np.ndarray]:
        """Q-values (and each layer's output) with the named weights and activations fake-quantized."""
        conv_w = per_channel(self.conv_w) if "conv" in weights else self.conv_w
        hidden_w = (per_channel(self.hidden_w) if "hidden" in weights else
                    per_tensor(self.hidden_w) if "hidden_tensor" in weights else self.hidden_w)
        adv_w, value_w = ((per_channel(self.adv_w), per_channel(self.value_w)) if "head" in weights
                          else (self.adv_w, self.value_w))
        c = np.maximum(self.conv(obs.astype(np.float64), conv_w), 0)
        if "conv" in acts:
            c = fake_quant(c, *ranges["conv"])
        h = np.maximum(c.reshape(len(obs), -1) @ hidden_w.T + self.hidden_b, 0)
        if "hidden" in acts:
            h = fake_quant(h, *ranges["hidden"])
        a, v = h @ adv_w.T + self.adv_b, h @ value_w.T + self.value_b
        if "head" in acts:
            a, v = fake_quant(a, *ranges["advantage"]), fake_quant(v, *ranges["value"])
        return {"conv": c, "hidden": h, "advantage": a, "value": v, "q": a + v}


def per_channel(w: np.ndarray) -> np.ndarray:
    """Symmetric int8 weights with one scale per output channel (axis 0), as TFLite's conv and Dense."""
    scale = np.abs(w).reshape(len(w), -1).max(1).reshape((-1,) + (1,) * (w.ndim - 1)) / 127
    scale = np.where(scale > 0, scale, 1.0)
    return np.round(w / scale) * scale


def per_tensor(w: np.ndarray) -> np.ndarray:
    """Symmetric int8 weights with one scale for the whole tensor, as tfmot QAT's Dense default."""
    scale = np.abs(w).max() / 127 or 1.0
    return np.round(w / scale) * scale


def fake_quant(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Asymmetric int8 over [lo, hi] (widened to hold 0, as TFLite's), back to real values."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = (hi - lo) / 255 or 1.0
    zero = np.round(-lo / scale)
    return (np.clip(np.round(x / scale) + zero, 0, 255) - zero) * scale


def litert_q_values(policy: Path, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The policy's q_values and action for the batch, from LiteRT."""
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_path=str(policy)).get_signature_runner("serving_default")
    out = runner(observations=obs)
    return np.asarray(out["q_values"], np.float64), np.asarray(out["action"])


def study(policy: Path, states: np.ndarray) -> list[dict]:
    """The header line, then one line per row of ROWS."""
    net = Network(policy)
    if tuple(states.shape[1:]) != tuple(net.obs_shape):
        sys.exit(f"states of shape {states.shape[1:]}, the policy takes {net.obs_shape}")
    float_run = net.forward(states)
    q = float_run["q"]
    ref_q, ref_action = litert_q_values(policy, states)
    difference = float(np.abs(q - ref_q).max())
    if not difference <= MAX_FLOAT_DIFFERENCE:
        sys.exit(f"the numpy forward pass differs from LiteRT's by {difference:.3g} (> {MAX_FLOAT_DIFFERENCE}): "
                 "it does not compute this policy")
    ranges = {name: (float(float_run[name].min()), float(float_run[name].max()))
              for name in ("conv", "hidden", "advantage", "value")}
    greedy = q.argmax(1)
    ordered = np.sort(q, 1)
    centered = q - q.mean(1, keepdims=True)
    lines = [{"policy": str(policy), "states": len(states), "shapes": net.shapes,
              "float_check": {"max_abs_difference": difference, "litert_action_agreement": float(np.mean(ref_action == greedy))},
              "median_action_gap": float(np.median(ordered[:, -1] - ordered[:, -2])),
              "activation_ranges": {name: [round(lo, 6), round(hi, 6)] for name, (lo, hi) in ranges.items()}}]
    for name, weights, acts in ROWS:
        qq = net.forward(states, weights, acts, ranges)["q"]
        error = np.abs((qq - qq.mean(1, keepdims=True)) - centered).mean()
        lines.append({"quantized": name, "agreement": round(float(np.mean(qq.argmax(1) == greedy)), 4),
                      "advantage_error": round(float(error), 6)})
    return lines


if __name__ == "__main__":
    main()

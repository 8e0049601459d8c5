"""The one file to ship: a checked, self-contained copy of a .tflite policy and how to call it from LiteRT.

`compress-dqn export POLICY --target tflite` writes it. The copy takes raw observations in any
runtime (graph_input.py); an export from before that carried its normalization as metadata is
rewritten on the way, and checked to choose the same actions as it did with its loader.
"""

from __future__ import annotations

from pathlib import Path
import numpy as np
from pydantic import BaseModel

from compress_dqn.deploy.tflite.graph_input import normalization_ops
from compress_dqn.deploy.litert.policy import TFLitePolicy, read_tflite
from compress_dqn.deploy.base import ExportOptions, ExportReport, policy_name
from compress_dqn.deploy.tflite.file import TFLiteFile
from compress_dqn.deploy.tflite.reader import SIGNATURE, unreadable
from compress_dqn.deploy.tflite.metadata import INPUT_NORMALIZATION, drop_metadata, input_normalization
from compress_dqn.errors import UserError
from compress_dqn.fileio import write_bytes_atomic, write_text_atomic


class TFLiteInput(BaseModel):
    """The shipped file's observation input."""

    dtype: str
    shape: list[int]
    caller_normalizes: bool


class TFLiteExport(ExportReport):
    """What `export --target tflite` wrote: the checked file, its usage snippets, its input and actions."""

    policy: str
    out: str
    usage: str
    bytes: int
    input: TFLiteInput
    n_actions: int
    rewrote_metadata_normalization: bool


def default_file(policy: Path) -> Path:
    """NAME.tflite in the current directory (NAME: policy_name)."""
    return Path(f"{policy_name(policy)}.tflite")


def export(policy: Path, out: Path | None = None, options: ExportOptions = ExportOptions()) -> TFLiteExport:
    """`export --target tflite`: write the self-contained policy to `out` (default ./NAME.tflite) and its usage
    snippets to OUT_STEM.usage.md; returns the figures. It takes no options."""
    policy = Path(policy)
    data, label = read_tflite(policy)
    out = Path(out) if out is not None else default_file(policy)
    if out.resolve() == policy.resolve():
        raise UserError(f"{out}: is the policy itself; pass another --out")
    data, upgraded = _self_contained(data, label)
    loaded = TFLitePolicy(data)  # refuses what LiteRT cannot load or prepare
    action_output = _action_output(data)
    write_bytes_atomic(out, data)
    usage = out.with_name(f"{out.stem}.usage.md")
    write_text_atomic(usage, usage_text(out.name, loaded, action_output))
    return TFLiteExport(policy=str(policy), out=str(out), usage=str(usage), bytes=len(data),
                        input=TFLiteInput(dtype=loaded.input_dtype.name, shape=list(loaded.obs_shape),
                                          caller_normalizes=loaded.input_normalization is not None),
                        n_actions=loaded.n_actions, rewrote_metadata_normalization=upgraded)


def _self_contained(data: bytes, label: str) -> tuple[bytes, bool]:
    """The bytes with a float input's metadata normalization moved into the graph (checked), and
    whether that was needed."""
    from ai_edge_litert.interpreter import Interpreter

    found = input_normalization(data, label)
    try:
        probe = Interpreter(model_content=data)
    except (ValueError, RuntimeError) as exc:  # not a flatbuffer LiteRT can read
        raise unreadable(label, str(exc) or type(exc).__name__) from None
    if found is None or np.dtype(probe.get_input_details()[0]["dtype"]).kind in "iu":
        return data, False  # self-contained already, or an int8 input whose caller normalizes
    model = TFLiteFile.decode(data, label)  # decoded once, both edits in place, packed once
    drop_metadata(model, INPUT_NORMALIZATION)
    normalization_ops(model, found)
    rewritten = model.pack()
    obs = np.random.default_rng(0).normal(found.mean, 2 * found.std, size=(512, found.mean.size)).astype(np.float32)
    before = _plain_actions(data, found.apply(obs))  # as the older loader fed it
    if not np.array_equal(_plain_actions(rewritten, obs), before):
        raise UserError(f"{label}: moving its normalization into the graph changed its actions (a bug); "
                        "re-export it with compress-dqn run")
    return rewritten, True


def _plain_actions(data: bytes, obs: np.ndarray) -> np.ndarray:
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_content=data).get_signature_runner(SIGNATURE)
    (name,) = runner.get_input_details()
    return np.concatenate([runner(**{name: row[None]})["action"] for row in obs])


def _action_output(data: bytes) -> int:
    """The action's position among the interpreter's outputs (C++ `typed_output_tensor<int32_t>(i)`)."""
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_content=data)
    index = interp.get_signature_runner(SIGNATURE).get_output_details()["action"]["index"]
    return [d["index"] for d in interp.get_output_details()].index(index)


def _python_input(policy: TFLitePolicy) -> tuple[str, str]:
    """The snippet's line(s) that turn an observation into the input tensor, and what they do."""
    if policy.input_normalization is None:
        return (f"x = np.asarray(observation, np.{policy.input_dtype.name})[None]",
                "Feed the raw observation: the file normalizes it itself.")
    normalization = policy.input_normalization
    mean, std = (np.array2string(v, separator=", ", precision=9) for v in (normalization.mean, normalization.std))
    return (f"x = (np.asarray(observation, np.float32) - np.array({mean}, np.float32)) / np.array({std}, np.float32)\n"
            "scale, zero_point = interpreter.get_input_details()[0][\"quantization\"]\n"
            "x = np.clip(np.round(x / scale + zero_point), -128, 127).astype(np.int8)[None]",
            "Its input is int8: normalize with the mean and std below, then quantize with the input's own scale.")


def usage_text(filename: str, policy: TFLitePolicy, action_output: int) -> str:
    """Markdown with a Python and a C++ LiteRT snippet that play `filename` on raw observations."""
    n = int(np.prod(policy.obs_shape))
    c_type = {"float32": "float", "int8": "int8_t", "uint8": "uint8_t"}.get(policy.input_dtype.name, "float")
    prepare, note = _python_input(policy)
    return f"""\
# {filename}

A DQN policy: one observation of shape {list(policy.obs_shape)} ({policy.input_dtype.name}) in, Q-values
for {policy.n_actions} actions and the greedy action (int32) out. {note} Play the `action` output: it is
the policy (argmax of `q_values` is the same action in files compress-dqn writes now, except an
int8-output one, whose Q-values are int8 on one coarse scale, and one with an `action_head`).

## Python (LiteRT: `pip install ai-edge-litert`)

```python
import numpy as np
from ai_edge_litert.interpreter import Interpreter

interpreter = Interpreter(model_path="{filename}")
interpreter.allocate_tensors()
runner = interpreter.get_signature_runner("serving_default")
input_index = runner.get_input_details()["observations"]["index"]
action_index = runner.get_output_details()["action"]["index"]
del runner  # a live signature runner makes invoke() refuse to run

def act(observation):
    {prepare.replace(chr(10), chr(10) + "    ")}
    interpreter.set_tensor(input_index, x)
    interpreter.invoke()
    return int(interpreter.get_tensor(action_index)[0])
```

## C++ (LiteRT / TensorFlow Lite)

```cpp
#include "tensorflow/lite/interpreter.h"
#include "tensorflow/lite/kernels/register.h"
#include "tensorflow/lite/model.h"

auto model = tflite::FlatBufferModel::BuildFromFile("{filename}");
tflite::ops::builtin::BuiltinOpResolver resolver;
std::unique_ptr<tflite::Interpreter> interpreter;
tflite::InterpreterBuilder(*model, resolver)(&interpreter);
interpreter->AllocateTensors();

// observation: {n} values{", normalized and quantized as in the Python above" if policy.input_normalization is not None else ""}
{c_type}* input = interpreter->typed_input_tensor<{c_type}>(0);
std::copy(observation, observation + {n}, input);
interpreter->Invoke();
int action = interpreter->typed_output_tensor<int32_t>({action_output})[0];
```
"""

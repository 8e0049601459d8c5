"""The output rule of a policy file: `action` is the policy, and `q_values` argmaxes to it.

A split int8 head (compress.rewrites.split_value_advantage) chooses the action on the advantage
head's fine int8 scale, but the converter adds value and advantage in int8 on the coarse scale of
their sum: the q_values output then ties or flips actions the advantage head tells apart (the
demo's prune-90-int8 scored 113.7 played by argmax(q_values), 484.0 by its action). Adding the two
heads in float after dequantizing each, as a QAT file already does, keeps every advantage step:
V is the same for all actions, so argmax(dequant(A) + dequant(V)) is argmax(A), the action.
In a float file A + V can round two advantages closer than V's last bit to one value: there the
action is taken from q_values itself (`action_from_q_values`), the same tensor. Both edits change a
decoded `TFLiteFile` in place; the export that chains them packs it once.
"""

from __future__ import annotations

import numpy as np

from compress_dqn.deploy.tflite.file import TFLiteFile, edit_bytes


def float_q_values(model: TFLiteFile) -> None:
    """An int8 ADD -> DEQUANTIZE before `q_values` replaced by DEQUANTIZE each side, float ADD (in place).

    Leaves the model unchanged where q_values is not computed that way (float files, QAT files, int8-output files)."""
    schema, graph = model.schema, model.graph
    named = model.signature_outputs()
    if "q_values" not in named:
        return
    ops = list(graph.operators)
    kinds = [model.builtin(op) for op in ops]
    producer = {int(op.outputs[0]): i for i, op in enumerate(ops)}
    dq_at = producer.get(named["q_values"])
    if dq_at is None or kinds[dq_at] != schema.BuiltinOperator.DEQUANTIZE:
        return
    add_at = producer.get(int(ops[dq_at].inputs[0]))
    if add_at is None or kinds[add_at] != schema.BuiltinOperator.ADD:
        return
    add = ops[add_at]
    if graph.tensors[int(add.outputs[0])].type != schema.TensorType.INT8 or add.builtinOptions.fusedActivationFunction:
        return
    a_index, v_index = (int(i) for i in add.inputs)
    summed = int(add.outputs[0])  # the int8 sum, read by nothing else: it becomes dequantized A (no new tensor)
    graph.tensors[summed].type, graph.tensors[summed].quantization = schema.TensorType.FLOAT32, None
    graph.tensors[summed].name = None  # inner tensors need no name: the rule costs the file 32 bytes, not more
    value = schema.TensorT()  # dequantized V: no name, no signature (an inner tensor needs neither)
    value.shape = np.array(graph.tensors[v_index].shape)
    value.type, value.buffer = schema.TensorType.FLOAT32, 0
    graph.tensors.append(value)
    dequantize = ops[dq_at]
    dequantize.inputs, dequantize.outputs = np.array([a_index], np.int32), np.array([summed], np.int32)
    dequantize_v = model.op(schema.BuiltinOperator.DEQUANTIZE, [v_index], [len(graph.tensors) - 1], version=2)
    add.inputs = np.array([summed, len(graph.tensors) - 1], np.int32)
    add.outputs = np.array([named["q_values"]], np.int32)
    kept = [op for i, op in enumerate(ops) if i not in (add_at, dq_at)]
    at = min(add_at, dq_at)
    graph.operators = kept[:at] + [dequantize, dequantize_v, add] + kept[at:]
    model.edited = True


def action_from_q_values(model: TFLiteFile) -> None:
    """A float ARG_MAX over the advantage head made to read the float q_values = A + V instead (in place).

    argmax(A + V) is argmax(A) but where float rounding ties them; reading one tensor, the action and
    argmax(q_values) agree everywhere. Int8 files keep their ARG_MAX on the int8 advantage head (its
    steps are far above a float's last bit, so the float sum never ties them). Leaves the model
    unchanged where there is nothing to change."""
    schema, graph = model.schema, model.graph
    named = model.signature_outputs()
    if not {"q_values", "action"} <= set(named):
        return
    ops = list(graph.operators)
    producer = {int(op.outputs[0]): i for i, op in enumerate(ops)}
    arg_at, add_at = producer.get(named["action"]), producer.get(named["q_values"])
    if arg_at is None or add_at is None:
        return
    arg, add = ops[arg_at], ops[add_at]
    if (model.builtin(arg) != schema.BuiltinOperator.ARG_MAX or model.builtin(add) != schema.BuiltinOperator.ADD
            or graph.tensors[int(arg.inputs[0])].type != schema.TensorType.FLOAT32
            or int(arg.inputs[0]) not in [int(i) for i in add.inputs]):
        return
    arg.inputs = np.array([named["q_values"], int(arg.inputs[1])], np.int32)
    graph.operators = [op for op in ops if op is not arg] + [arg]  # after the ADD that computes q_values
    model.edited = True


def with_float_q_values(data: bytes) -> bytes:
    """The file's bytes with `float_q_values` applied (the bytes themselves where it changes nothing)."""
    return edit_bytes(data, float_q_values)

"""The output rule of a policy file: `action` is the policy, and `q_values` argmaxes to it.

A split int8 head (compress.rewrites.split_value_advantage) chooses the action on the advantage
head's fine int8 scale, but the converter adds value and advantage in int8 on the coarse scale of
their sum: the q_values output then ties or flips actions the advantage head tells apart (the
demo's prune-90-int8 scored 113.7 played by argmax(q_values), 484.0 by its action). Adding the two
heads in float after dequantizing each, as a QAT file already does, keeps every advantage step:
V is the same for all actions, so argmax(dequant(A) + dequant(V)) is argmax(A), the action.
In a float file A + V can round two advantages closer than V's last bit to one value: there the
action is taken from q_values itself (`action_from_float_q_values`), the same tensor.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from compress_dqn.deploy.policy import SIGNATURE
from compress_dqn.deploy.tflite_metadata import pack_model


def with_float_q_values(data: bytes) -> bytes:
    """The model with an int8 ADD -> DEQUANTIZE before `q_values` replaced by DEQUANTIZE each side, float ADD.

    Returns data unchanged where q_values is not computed that way (float files, QAT files, int8-output files)."""
    from ai_edge_litert import schema_py_generated as schema

    model = schema.ModelT.InitFromPackedBuf(bytearray(data), 0)
    graph = model.subgraphs[0]
    sig = next((s for s in model.signatureDefs or [] if (s.signatureKey or b"").decode() == SIGNATURE), None)
    named = {e.name.decode(): int(e.tensorIndex) for e in (sig.outputs if sig is not None else [])}
    if "q_values" not in named:
        return data
    ops = list(graph.operators)
    kinds = [_builtin(schema, model, op) for op in ops]
    producer = {int(op.outputs[0]): i for i, op in enumerate(ops)}
    dq_at = producer.get(named["q_values"])
    if dq_at is None or kinds[dq_at] != schema.BuiltinOperator.DEQUANTIZE:
        return data
    add_at = producer.get(int(ops[dq_at].inputs[0]))
    if add_at is None or kinds[add_at] != schema.BuiltinOperator.ADD:
        return data
    add = ops[add_at]
    if graph.tensors[int(add.outputs[0])].type != schema.TensorType.INT8 or add.builtinOptions.fusedActivationFunction:
        return data
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
    dequantize_v = _op(schema, model, schema.BuiltinOperator.DEQUANTIZE, [v_index], [len(graph.tensors) - 1], 2)
    add.inputs = np.array([summed, len(graph.tensors) - 1], np.int32)
    add.outputs = np.array([named["q_values"]], np.int32)
    kept = [op for i, op in enumerate(ops) if i not in (add_at, dq_at)]
    at = min(add_at, dq_at)
    graph.operators = kept[:at] + [dequantize, dequantize_v, add] + kept[at:]
    return pack_model(model, len(data) + 512)


def action_from_float_q_values(data: bytes) -> bytes:
    """The model with a float ARG_MAX over the advantage head reading the float q_values = A + V instead.

    argmax(A + V) is argmax(A) but where float rounding ties them; reading one tensor, the action and
    argmax(q_values) agree everywhere. Int8 files keep their ARG_MAX on the int8 advantage head (its
    steps are far above a float's last bit, so the float sum never ties them). Returns data unchanged
    where there is nothing to change."""
    from ai_edge_litert import schema_py_generated as schema

    model = schema.ModelT.InitFromPackedBuf(bytearray(data), 0)
    graph = model.subgraphs[0]
    sig = next((s for s in model.signatureDefs or [] if (s.signatureKey or b"").decode() == SIGNATURE), None)
    named = {e.name.decode(): int(e.tensorIndex) for e in (sig.outputs if sig is not None else [])}
    if not {"q_values", "action"} <= set(named):
        return data
    ops = list(graph.operators)
    producer = {int(op.outputs[0]): i for i, op in enumerate(ops)}
    arg_at, add_at = producer.get(named["action"]), producer.get(named["q_values"])
    if arg_at is None or add_at is None:
        return data
    arg, add = ops[arg_at], ops[add_at]
    if (_builtin(schema, model, arg) != schema.BuiltinOperator.ARG_MAX or _builtin(schema, model, add) != schema.BuiltinOperator.ADD
            or graph.tensors[int(arg.inputs[0])].type != schema.TensorType.FLOAT32
            or int(arg.inputs[0]) not in [int(i) for i in add.inputs]):
        return data
    arg.inputs = np.array([named["q_values"], int(arg.inputs[1])], np.int32)
    graph.operators = [op for op in ops if op is not arg] + [arg]  # after the ADD that computes q_values
    return pack_model(model, len(data) + 256)


def _builtin(schema: Any, model: Any, op: Any) -> int:
    code = model.operatorCodes[op.opcodeIndex]
    return max(code.builtinCode, code.deprecatedBuiltinCode)


def _op(schema: Any, model: Any, code: int, inputs: list[int], outputs: list[int], version: int) -> Any:
    """An operator of builtin `code`, its operator code added where the model has none of at least `version`."""
    codes = model.operatorCodes
    index = next((i for i, c in enumerate(codes) if max(c.builtinCode, c.deprecatedBuiltinCode) == code
                  and not c.customCode and c.version >= version), None)
    if index is None:
        entry = schema.OperatorCodeT()
        entry.builtinCode, entry.deprecatedBuiltinCode, entry.version = code, min(code, 127), version
        codes.append(entry)
        index = len(codes) - 1
    op = schema.OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = index, np.array(inputs, np.int32), np.array(outputs, np.int32)
    return op


def q_values_disagree(policy: Any, observations: np.ndarray) -> int:
    """States where argmax of the q_values output is not the action output (a policy with q_values() and actions())."""
    return int(np.sum(np.argmax(policy.q_values(observations), axis=1) != policy.actions(observations)))

"""TF-Agents DQN policies saved with PolicySaver: the QNetwork's variables as a PortedNet.

`PolicySaver(agent.policy).save(dir)` writes a SavedModel of the policy, not of a Keras model: its
`action` signature takes a TimeStep and gives the greedy action, never Q-values. The Q-network is
read from the data alone: the weights from the SavedModel's checkpoint (variables/, through
TensorFlow's checkpoint reader, each under its variable name, `QNetwork/EncodingNetwork/dense/kernel`,
...), and what the variables cannot say (each layer's activation, a convolution's strides and
padding, a preprocessing layer) from the graph's op list in saved_model.pb, parsed as a protobuf.
Nothing in the SavedModel is run to read it; only the port check runs its `action` signature,
and compares actions (the only output it has).

Ported: a QNetwork (DqnAgent, DdqnAgent) whose EncodingNetwork is Conv2D (valid padding) and Dense
layers with ReLU or tanh, then the output layer. Refused in one line each: preprocessing_layers,
a CategoricalQNetwork (C51), a recurrent network, any other network.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from tensorflow.core.framework.node_def_pb2 import NodeDef

from compress_dqn.errors import UserError
from compress_dqn.port.spec import Layer, PortedNet

SPECS = "policy_specs.pbtxt"
_ACTIVATIONS = {"Relu": "relu", "Tanh": "tanh"}
_OTHER_ACTIVATIONS = ("Elu", "Selu", "Sigmoid", "Relu6", "LeakyRelu", "Softplus", "Softsign", "Gelu", "Softmax")
_ENCODER = "QNetwork/EncodingNetwork/"


def is_policy_saver(path: Path) -> bool:
    """A directory PolicySaver wrote: a SavedModel with TF-Agents' policy_specs.pbtxt beside it."""
    return (path / "saved_model.pb").is_file() and (path / SPECS).is_file()


def _specs(path: Path, label: str) -> Any:
    """policy_specs.pbtxt as a StructuredValue (protobuf text; nothing in it is run)."""
    from google.protobuf import text_format
    from tensorflow.core.protobuf import struct_pb2

    value = struct_pb2.StructuredValue()
    try:
        text_format.Parse((path / SPECS).read_text(), value)
    except (OSError, UnicodeDecodeError, text_format.ParseError) as exc:
        raise UserError(f"{label}: {SPECS} cannot be read ({str(exc)[:100]}); save the policy again") from None
    return value


def _field(value: Any, key: str) -> Any:
    kind = value.WhichOneof("kind")
    if kind == "dict_value":
        return value.dict_value.fields.get(key)
    if kind == "named_tuple_value":
        return next((pair.value for pair in value.named_tuple_value.values if pair.key == key), None)
    return None


def _check_specs(path: Path, label: str) -> None:
    """A recurrent policy has a policy state; a policy with preprocessing_layers usually a nested observation."""
    specs = _specs(path, label)
    state = _field(specs, "policy_state_spec")
    if state is not None and "tensor_spec_value" in str(state):  # a state of any tensor: an RNN's
        raise UserError(f"{label}: a recurrent policy (it has a policy state); ported: TF-Agents' feed-forward QNetwork")
    data = _field(specs, "collect_data_spec")
    observation = _field(data, "observation") if data is not None else None
    if observation is not None and observation.WhichOneof("kind") not in ("tensor_spec_value", "bounded_tensor_spec_value"):
        raise UserError(f"{label}: its observation is nested ({observation.WhichOneof('kind')}), which needs "
                        "preprocessing_layers; a QNetwork with preprocessing_layers is not ported: give it one "
                        "observation tensor")


def _variables(path: Path, label: str) -> list[tuple[str, np.ndarray]]:
    """(variable name, value) of the policy's model variables in the order the policy lists them."""
    import tensorflow as tf
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    prefix = path / "variables" / "variables"
    try:
        reader = tf.train.load_checkpoint(str(prefix))
        graph = trackable_object_graph_pb2.TrackableObjectGraph()
        graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    except Exception as exc:  # TensorFlow raises several kinds for a missing or damaged checkpoint
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:120]
        raise UserError(f"{label}: its variables/ cannot be read ({reason}); save the policy again") from None
    found = []
    for node in graph.nodes:
        for attribute in node.attributes:
            match = re.fullmatch(r"model_variables/(\d+)/\.ATTRIBUTES/VARIABLE_VALUE", attribute.checkpoint_key)
            if attribute.name == "VARIABLE_VALUE" and match:
                found.append((int(match.group(1)), attribute.full_name, reader.get_tensor(attribute.checkpoint_key)))
    if not found:
        raise UserError(f"{label}: a PolicySaver directory without model variables; save a DQN agent's policy")
    return [(name, np.asarray(value)) for _, name, value in sorted(found, key=lambda item: item[0])]


def _graph_ops(path: Path, label: str) -> dict[str, NodeDef]:
    """Every node of the SavedModel's functions by name (the ops are read, not run)."""
    from tensorflow.core.protobuf import saved_model_pb2

    model = saved_model_pb2.SavedModel()
    try:
        model.ParseFromString((path / "saved_model.pb").read_bytes())
    except Exception as exc:  # protobuf's DecodeError and OSError
        raise UserError(f"{label}: saved_model.pb cannot be read ({str(exc)[:100]}); save the policy again") from None
    nodes: dict[str, NodeDef] = {}
    for graph in model.meta_graphs:
        for function in graph.graph_def.library.function:
            for node in function.node_def:
                nodes.setdefault(node.name, node)
    return nodes


def _network(names: list[str], label: str) -> None:
    """Refuse, by name, every network but a QNetwork."""
    roots = sorted({name.split("/", 1)[0] for name in names})
    if any(root.startswith("CategoricalQNetwork") for root in roots):
        raise UserError(f"{label}: a CategoricalQNetwork (C51, a distributional Q-network); not ported: ported "
                        "is TF-Agents' QNetwork (DqnAgent, DdqnAgent)")
    if any("Rnn" in root or "rnn" in root for root in roots) or any(re.search(r"/(lstm|gru|dynamic_unroll)", n) for n in names):
        raise UserError(f"{label}: a recurrent Q-network ({', '.join(roots)}); not ported: ported is TF-Agents' "
                        "feed-forward QNetwork")
    if roots != ["QNetwork"]:
        raise UserError(f"{label}: a policy of {', '.join(roots)}; ported is TF-Agents' QNetwork (DqnAgent, DdqnAgent)")


def _layer_groups(variables: list[tuple[str, np.ndarray]], label: str) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(scope, kernel, bias) per layer, in the policy's order; any other variable refused."""
    groups: dict[str, dict[str, np.ndarray]] = {}
    for name, value in variables:
        scope, _, leaf = name.rpartition("/")
        groups.setdefault(scope, {})[leaf] = value
    layers = []
    for scope, parts in groups.items():
        extra = sorted(set(parts) - {"kernel", "bias"})
        kernel = parts.get("kernel")
        if extra or kernel is None or kernel.ndim not in (2, 4):
            what = f"{scope}/{extra[0]}" if extra else f"{scope} (a kernel of shape {None if kernel is None else kernel.shape})"
            raise UserError(f"{label}: {what} is no Dense or Conv2D weight; ported: a QNetwork of Conv2D and Dense layers")
        bias = parts.get("bias", np.zeros(kernel.shape[-1], dtype=np.float32))
        layers.append((scope, kernel, bias))
    return layers


def _activation(scope: str, nodes: dict[str, NodeDef], label: str) -> str:
    ops = {node.op for name, node in nodes.items() if name.startswith(scope + "/")}
    other = sorted(ops & set(_OTHER_ACTIVATIONS))
    if other:
        raise UserError(f"{label}: {scope} uses activation {other[0]}; ported activations: ReLU, tanh")
    found = sorted(ops & set(_ACTIVATIONS))
    if len(found) > 1:
        raise UserError(f"{label}: {scope} holds both {' and '.join(found)}; cannot tell its activation")
    return _ACTIVATIONS[found[0]] if found else "linear"


def _stride(scope: str, nodes: dict[str, NodeDef], label: str) -> int:
    """The Conv2D's stride, read from the graph (valid padding, NHWC, no dilation)."""
    conv = [node for name, node in nodes.items() if name.startswith(scope + "/") and node.op == "Conv2D"]
    if not conv:
        raise UserError(f"{label}: no Conv2D op for {scope} in the graph; cannot tell its stride")
    attr = conv[0].attr
    strides = list(attr["strides"].list.i)
    padding = attr["padding"].s.decode()
    dilations = list(attr["dilations"].list.i) if "dilations" in attr else [1, 1, 1, 1]
    fmt = attr["data_format"].s.decode() if "data_format" in attr else "NHWC"
    if padding != "VALID" or fmt != "NHWC" or len(strides) != 4 or strides[1] != strides[2] or set(dilations) != {1}:
        raise UserError(f"{label}: {scope} is a {padding} {fmt} convolution with strides {strides[1:3]} and dilations "
                        f"{dilations[1:3]}; ported: valid padding, square strides, no dilation")
    return int(strides[1])


def _preprocessing(layer_scopes: set[str], nodes: dict[str, NodeDef], label: str) -> None:
    """Ops in the encoder outside its weight layers and flatten are a preprocessing layer's: refused."""
    for name in nodes:
        if not name.startswith(_ENCODER):
            continue
        sub = _ENCODER + name[len(_ENCODER):].split("/", 1)[0]
        if sub not in layer_scopes and not re.fullmatch(r"flatten(_\d+)?|batch_(un)?flatten(_\d+)?", sub[len(_ENCODER):]):
            raise UserError(f"{label}: {sub} is a preprocessing layer (QNetwork's preprocessing_layers); not "
                            "ported: apply it in the environment and train without it")


def read_tfagents(path: Path, label: str) -> PortedNet:
    """The QNetwork of a PolicySaver directory in Keras layout (TF-Agents is Keras: no transposes)."""
    _check_specs(path, label)
    variables = _variables(path, label)
    _network([name for name, _ in variables], label)
    groups = _layer_groups(variables, label)
    nodes = _graph_ops(path, label)
    _preprocessing({scope for scope, _, _ in groups}, nodes, label)
    layers = []
    for i, (scope, kernel, bias) in enumerate(groups):
        activation = _activation(scope, nodes, label)
        if i == len(groups) - 1 and activation != "linear":
            raise UserError(f"{label}: its output layer {scope} has activation {activation} (q_layer_activation_fn); "
                            "ported: a linear output layer")
        stride = _stride(scope, nodes, label) if kernel.ndim == 4 else 1
        layers.append(Layer(np.asarray(kernel, dtype=np.float32), np.asarray(bias, dtype=np.float32), activation, stride))
    net = PortedNet(layers, None, label)
    net.notes.append("read from the PolicySaver SavedModel's variables: "
                     + ", ".join(f"{scope} ({layer.activation})" for (scope, _, _), layer in zip(groups, layers)))
    return net


def reference(path: Path) -> Any:
    """The SavedModel's own `action` signature on a batch of observations (mid-episode TimeSteps): greedy actions.

    Run through TensorFlow's graph-mode SavedModel loader: tf.saved_model.load would first rebuild the
    policy's other functions, whose outputs name tensorflow-probability's types (not installed here)."""
    import tensorflow as tf

    graph = tf.Graph()
    session = tf.compat.v1.Session(graph=graph)
    with graph.as_default():
        signature = tf.compat.v1.saved_model.load(session, ["serve"], str(path)).signature_def["action"]
    inputs = {key: value.name for key, value in signature.inputs.items()}
    dtype = tf.dtypes.as_dtype(signature.inputs["0/observation"].dtype).as_numpy_dtype
    output = signature.outputs["action"].name

    def actions(obs: np.ndarray) -> np.ndarray:
        n = len(obs)
        feed = {inputs["0/step_type"]: np.ones(n, np.int32), inputs["0/reward"]: np.zeros(n, np.float32),
                inputs["0/discount"]: np.ones(n, np.float32), inputs["0/observation"]: np.asarray(obs, dtype=dtype)}
        return np.asarray(session.run(output, feed)).reshape(n)

    return actions

"""A Keras 3 model config checked against the layers a Q-network is made of, and its graph as a chain and a head.

Runs on the config as JSON data, before any Keras loader sees the file. Every object the config
names (layers, and inside them dtype policies, initializers, regularizers, constraints) must be a
Keras built-in on the allow-list below: a Lambda, a custom or subclassed class, or a module outside
Keras is refused in one line naming the layer, so nothing stored in the file can run. The graph of
a Sequential or functional model becomes the chain of single-input layers from the observation,
then (where the graph branches, as a dueling head's value and advantage streams do) the head: the
layers after the fork, each with the tensors it reads, in an order where inputs come first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from compress_dqn.errors import UserError
from compress_dqn.port.keras3_file import layer_name

LAYERS = ("InputLayer", "Dense", "Conv2D", "Flatten", "ReLU", "Activation", "Rescaling", "Normalization",
          "BatchNormalization", "Dropout", "Permute", "Add", "Subtract", "Mean")
MERGES = ("Add", "Subtract", "Mean")  # Mean is Keras 3's ops.mean, as a dueling head averages advantages
NESTED = ("DTypePolicy", "FloatDTypePolicy", "__keras_tensor__", "__tuple__")
NESTED_MODULES = ("keras.initializers", "keras.regularizers", "keras.constraints")
MODELS = ("Sequential", "Functional", "Model")
ATARI_HINT = ("keras.io's Atari DQN transposes channel-first frames in a Lambda: give the network channel-last "
              "frames, keras.Input((84, 84, 4)), or use keras.layers.Permute((2, 3, 1)) instead")


@dataclass
class Graph:
    """A checked Keras 3 model: input shape (no batch), chain, head, and every layer config in model order."""

    input_shape: tuple[int | None, ...]
    chain: list[dict]
    head: list[tuple[dict, list[str]]] = field(default_factory=list)
    fork: str = ""
    output: str = ""
    layers: list[dict] = field(default_factory=list)


def _identifier(text: Any) -> bool:
    return isinstance(text, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", text) is not None


def _keras_module(module: Any) -> bool:
    return module is None or module == "keras" or (isinstance(module, str) and module.startswith("keras."))


def _check_nested(value: Any, where: str, label: str) -> None:
    """Every serialized object inside a layer's config: a Keras built-in from an allowed module."""
    if isinstance(value, list):
        for item in value:
            _check_nested(item, where, label)
        return
    if not isinstance(value, dict):
        return
    if "class_name" in value:
        cls, module = value.get("class_name"), value.get("module")
        allowed = (cls in NESTED and _keras_module(module)) or (module in NESTED_MODULES and _identifier(cls))
        if not allowed or value.get("registered_name") not in (None, cls):
            raise UserError(f"{label}: {where} names {module or '?'}.{cls}, which is not a Keras built-in this reader "
                            "allows (custom objects carry code the file does not hold); save the model without it")
    for item in value.values():
        _check_nested(item, where, label)


def check_layer(layer: Any, label: str, takes_input: bool) -> dict:
    """One layer config against the allow-list; refused in one line naming the layer."""
    if not isinstance(layer, dict) or not isinstance(layer.get("config"), dict):
        raise UserError(f"{label}: a layer entry that is not a layer config; save the model again")
    cls, name = layer.get("class_name"), layer_name(layer)
    registered = layer.get("registered_name")
    if cls == "Lambda":
        hint = f"; {ATARI_HINT}" if takes_input else ""
        raise UserError(f"{label}: layer {name} is a Lambda, which would run Python code stored in the file; rebuild "
                        f"the network from standard layers{hint}")
    if registered not in (None, cls) or not _keras_module(layer.get("module")) or not _identifier(cls):
        what = registered or (cls if not _identifier(cls) else layer.get("module"))  # .h5 names custom classes "pkg>Name"
        raise UserError(f"{label}: layer {name} is a custom object ({what}), whose code "
                        "is not in the file and is not run; rebuild the network from Keras's built-in layers")
    if cls in MODELS:
        raise UserError(f"{label}: layer {name} is a nested model; build the Q-network as one Sequential or "
                        "functional model")
    if cls not in LAYERS:
        raise UserError(f"{label}: layer {name} is a {cls}, which is not ported; a Keras 3 Q-network comes in made "
                        f"of {', '.join(LAYERS[:-1])} (Mean in a dueling head)")
    if cls == "Mean" and layer.get("module") not in (None, "keras.src.ops.numpy"):
        raise UserError(f"{label}: layer {name} is a Mean from {layer.get('module')}; only keras.ops.mean is ported")
    for key, value in layer.items():  # its config, inbound nodes and build config: Keras would deserialize them all
        if key not in ("class_name", "module", "registered_name"):
            _check_nested(value, f"layer {name}", label)
    return layer


def _shape(value: Any, label: str) -> tuple[int | None, ...]:
    if not isinstance(value, list) or not value or not all(d is None or isinstance(d, int) for d in value):
        raise UserError(f"{label}: the model's input shape is not readable from its config; save it with an "
                        "explicit keras.Input(shape)")
    return tuple(value[1:])


def _input_shape(layer: dict, label: str) -> tuple[int | None, ...]:
    config = layer["config"]
    shape = config.get("batch_shape") or config.get("batch_input_shape")
    if shape is None and isinstance(layer.get("build_config"), dict):
        shape = layer["build_config"].get("input_shape")
    return _shape(shape, label)


def _inputs(layer: dict, label: str) -> list[str]:
    """The names of the layers whose outputs this layer reads (old- and new-style inbound nodes)."""
    nodes = layer.get("inbound_nodes") or []
    if len(nodes) > 1:
        raise UserError(f"{label}: layer {layer_name(layer)} is called {len(nodes)} times (a shared layer); not ported")
    names: list[str] = []

    def visit(item: Any) -> None:
        if isinstance(item, dict) and item.get("class_name") == "__keras_tensor__":
            history = item.get("config", {}).get("keras_history")
            if not isinstance(history, list) or not history or not isinstance(history[0], str):
                raise UserError(f"{label}: layer {layer_name(layer)} reads an unreadable tensor; save the model again")
            names.append(history[0])
        elif isinstance(item, dict):
            for value in item.get("args", []):
                visit(value)
        elif isinstance(item, list):
            if len(item) >= 3 and isinstance(item[0], str) and isinstance(item[1], int):  # old style [name, node, index, kwargs]
                names.append(item[0])
            else:
                for value in item:
                    visit(value)

    for node in nodes:
        visit(node)
    return names


def _endpoint(value: Any, what: str, label: str) -> str:
    """The single input or output layer of a functional model ([name, 0, 0] or [[name, 0, 0]])."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], list):
        value = value[0]
    if not (isinstance(value, list) and value and isinstance(value[0], str)):
        raise UserError(f"{label}: the model has several {what}s; a Q-network maps one observation input to one "
                        "Q-value output")
    return value[0]


def read_graph(config: dict, label: str) -> Graph:
    """The checked graph of a Keras 3 model config (the top-level object of config.json or model_config)."""
    cls = config.get("class_name")
    body = config.get("config")
    if (cls not in MODELS or not isinstance(body, dict) or not isinstance(body.get("layers"), list)
            or config.get("registered_name") not in (None, cls) or not _keras_module(config.get("module"))):
        raise UserError(f"{label}: the model is a {cls} (a subclassed model's forward pass is Python code, not in the "
                        "file); build the Q-network as keras.Sequential or a functional keras.Model")
    _check_nested({k: v for k, v in body.items() if k != "layers"}, "the model's config", label)
    raw = body["layers"]
    if cls == "Sequential":
        return _sequential(body, raw, label)
    return _functional(body, raw, label)


def _sequential(body: dict, raw: list, label: str) -> Graph:
    layers = [check_layer(layer, label, takes_input=i == 0 or (i == 1 and raw[0].get("class_name") == "InputLayer"))
              for i, layer in enumerate(raw)]
    chain = [layer for layer in layers if layer["class_name"] != "InputLayer"]
    if not chain:
        raise UserError(f"{label}: the model has no layers")
    if layers[0]["class_name"] == "InputLayer":
        shape = _input_shape(layers[0], label)
    elif body.get("build_input_shape") is not None:
        shape = _shape(body["build_input_shape"], label)
    else:
        shape = _input_shape(layers[0], label)
    merge = next((layer for layer in chain if layer["class_name"] in MERGES), None)
    if merge is not None:
        raise UserError(f"{label}: layer {layer_name(merge)} ({merge['class_name']}) in a Sequential model; a dueling "
                        "head is built in a functional model")
    return Graph(shape, chain, layers=layers)


def _functional(body: dict, raw: list, label: str) -> Graph:
    by_name: dict[str, dict] = {}
    for layer in raw:
        name = layer_name(layer) if isinstance(layer, dict) else "?"
        by_name[name] = layer
    source = _endpoint(body.get("input_layers"), "input", label)
    output = _endpoint(body.get("output_layers"), "output", label)
    if source not in by_name or output not in by_name:
        raise UserError(f"{label}: its input or output layer is not among its layers; save the model again")
    parents = {name: _inputs(layer, label) if isinstance(layer, dict) else [] for name, layer in by_name.items()}
    for name, layer in by_name.items():
        check_layer(layer, label, takes_input=parents[name] == [source])
        if any(p not in by_name for p in parents[name]):
            raise UserError(f"{label}: layer {name} reads a layer the model does not have; save the model again")
    if by_name[source]["class_name"] != "InputLayer":
        raise UserError(f"{label}: the model's input {source} is not an InputLayer")
    order = _reaching(output, parents, label)
    if source not in order:
        raise UserError(f"{label}: the output {output} does not depend on the input {source}")
    consumers = {name: [c for c in order if name in parents[c]] for name in order}
    chain, current = [], source
    while current != output:
        after = consumers[current]
        if len(after) != 1 or parents[after[0]] != [current] or by_name[after[0]]["class_name"] in MERGES:
            break
        current = after[0]
        chain.append(by_name[current])
    head = [(by_name[name], parents[name]) for name in order
            if name != source and by_name[name] not in chain]
    return Graph(_input_shape(by_name[source], label), chain, head, current, output,
                 [layer for layer in raw if isinstance(layer, dict)])


def _reaching(output: str, parents: dict[str, list[str]], label: str) -> list[str]:
    """The layers the output depends on, each after the layers it reads (a cycle is refused)."""
    order: list[str] = []
    state: dict[str, int] = {}
    stack: list[tuple[str, bool]] = [(output, False)]
    while stack:
        name, done = stack.pop()
        if done:
            state[name] = 2
            order.append(name)
            continue
        if state.get(name) == 2:
            continue
        if state.get(name) == 1:
            raise UserError(f"{label}: the model's graph has a cycle at {name}; save the model again")
        state[name] = 1
        stack.append((name, True))
        stack.extend((p, False) for p in reversed(parents[name]) if state.get(p) != 2)
    return order

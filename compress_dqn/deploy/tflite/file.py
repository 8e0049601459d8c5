"""One .tflite as one editable object: decoded once, edited in place by every file edit, packed once.

Each edit of a policy file (slim tensor names, input normalization in the graph or as metadata,
float q_values, the action from q_values) takes a `TFLiteFile` and changes its object tree; the
export that chains them packs the result once. A file no edit changed packs to its own bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from compress_dqn.deploy.tflite.reader import SIGNATURE, builtin, decode, litert_schema, pack, read_tflite


class TFLiteFile:
    """A decoded .tflite (a schema ModelT) with its source bytes, its label for messages and whether it was edited."""

    def __init__(self, model: Any, schema: Any, source: bytes, label: str = "<bytes>") -> None:
        self.model, self.schema, self.source, self.label = model, schema, source, label
        self.edited = False
        """Whether an edit changed the object tree (pack() returns `source` itself otherwise)."""

    @classmethod
    def decode(cls, data: bytes, label: str = "<bytes>", schema: Any = None) -> TFLiteFile:
        """The file's bytes decoded and checked (reader.decode: a damaged file is one line naming it)."""
        schema = schema or litert_schema()
        return cls(decode(data, label, schema), schema, bytes(data), label)

    @classmethod
    def read(cls, source: Any, schema: Any = None) -> TFLiteFile:
        """A .tflite path (or bytes) read, checked to be a TFLite flatbuffer, and decoded."""
        data, label = read_tflite(source)
        return cls.decode(data, label, schema)

    def pack(self, extra: int = 1024) -> bytes:
        """The file's bytes: packed once after edits, or the source bytes where no edit changed anything."""
        return pack(self.model, len(self.source) + extra) if self.edited else self.source

    def add_buffer(self, data: bytes) -> int:
        """A new buffer holding `data`; returns its index (what a constant tensor or metadata entry names)."""
        buffer = self.schema.BufferT()
        buffer.data = np.frombuffer(data, dtype=np.uint8)
        self.model.buffers.append(buffer)
        return len(self.model.buffers) - 1

    @property
    def graph(self) -> Any:
        """The first (a policy's only) subgraph."""
        return self.model.subgraphs[0]

    def builtin(self, op: Any) -> int:
        """An operator's builtin op number."""
        return builtin(self.model.operatorCodes[op.opcodeIndex])

    def signature(self) -> Any:
        """The serving signature, or None."""
        return next((s for s in self.model.signatureDefs or []
                     if (s.signatureKey or b"").decode() == SIGNATURE), None)

    def signature_outputs(self) -> dict[str, int]:
        """The serving signature's output name -> tensor index (empty without one)."""
        sig = self.signature()
        return {e.name.decode(): int(e.tensorIndex) for e in (sig.outputs or [] if sig is not None else [])}

    def op(self, code: int, inputs: list[int], outputs: list[int], version: int = 1,
           options_type: int = 0, options: Any = None) -> Any:
        """A new operator of builtin `code`, its operator code added where the model has none of at least `version`."""
        codes = self.model.operatorCodes
        index = next((i for i, c in enumerate(codes)
                      if builtin(c) == code and not c.customCode and c.version >= version), None)
        if index is None:
            entry = self.schema.OperatorCodeT()
            entry.builtinCode, entry.deprecatedBuiltinCode, entry.version = code, min(code, 127), version
            codes.append(entry)
            index = len(codes) - 1
        op = self.schema.OperatorT()
        op.opcodeIndex, op.inputs, op.outputs = index, np.array(inputs, np.int32), np.array(outputs, np.int32)
        if options is not None:
            op.builtinOptionsType, op.builtinOptions = options_type, options
        return op


def edit_bytes(data: bytes, edit: Callable[..., Any], *args: Any) -> bytes:
    """`edit` applied to the file's bytes (decoded, edited, packed): for callers holding one edit and bytes."""
    model = TFLiteFile.decode(data)
    edit(model, *args)
    return model.pack()

"""Reading a user's ONNX file by what it holds, not by its name.

onnx picks a file's format from its extension, so a binary model named ``*.json`` or
``*.prototxt`` was read as text and refused, and a reader that gave up on it saw no external
data files to protect or hash. Every reading of a user's model goes through :func:`read`:
the bytes are a binary model when they parse as a ModelProto holding a graph; otherwise the
text format the extension names (json, textproto, onnxtxt) is tried, as onnx would.
"""

from __future__ import annotations

import os


def read(path, external=True):
    """The ModelProto in the file ``path``, with its external data loaded unless
    ``external=False``. Raises what onnx or protobuf raise for a file that holds no model."""
    import onnx  # late: the plugin's start-up imports the guard, which reads no model then
    from onnx import serialization

    path = os.fspath(path)
    with open(path, "rb") as fh:
        data = fh.read()
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
        binary = model.HasField("graph")
    except Exception:  # protobuf's DecodeError: not binary, perhaps text
        binary = False
    if not binary:
        fmt = serialization.registry.get_format_from_file_extension(os.path.splitext(path)[1].lower())
        # no text format named: protobuf's own error (or a graphless model) says what the file is
        model = serialization.registry.get(fmt or "protobuf").deserialize_proto(data, onnx.ModelProto())
    if external:
        onnx.load_external_data_for_model(model, os.path.dirname(path))
    return model

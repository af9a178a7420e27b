"""Reading a user's ONNX file by what it holds, not by its name.

onnx picks a file's format from its extension, so a binary model named ``*.json`` or
``*.prototxt`` was read as text and refused, and a reader that gave up on it saw no external
data files to protect or hash. Every reading of a user's model goes through :func:`read`:
the bytes are a binary model when they parse as a ModelProto holding a graph; otherwise the
text format the extension names (json, textproto, onnxtxt) is tried, as onnx would.

A binary model can also be walked field by field without parsing it (:func:`fields`), so
that what a caller needs of it (:func:`external_locations`; the model's large inline weights
left in the file) costs no copy of its weights.
"""

from __future__ import annotations

import mmap
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


# -- a binary model walked without parsing it --------------------------------------------------
# Field numbers (onnx.proto): ModelProto graph 7, functions 25; GraphProto node 1, initializer 5;
# FunctionProto node 7; NodeProto attribute 5; AttributeProto t 5, g 6, tensors 10, graphs 11;
# TensorProto name 8, external_data 13, data_location 14; StringStringEntryProto key 1, value 2.
_EXTERNAL = 1  # TensorProto.EXTERNAL


def varint(buf, pos):
    """``(value, position after it)`` of the protobuf varint at ``pos`` of ``buf``."""
    value, shift = 0, 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def fields(buf, start, end):
    """``(field, wire type, header start, value start, value end)`` of a message's fields in
    ``buf[start:end]``; ValueError or IndexError where the bytes are no protobuf message."""
    pos = start
    while pos < end:
        head = pos
        key, pos = varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            _, after = varint(buf, pos)
        elif wire == 1:
            after = pos + 8
        elif wire == 2:
            length, pos = varint(buf, pos)
            after = pos + length
        elif wire == 5:
            after = pos + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if after > end:
            raise ValueError("a protobuf field runs past its message")
        yield field, wire, head, pos, after
        pos = after


def external_locations(path):
    """``[(kind, tensor name, location)]`` of the tensors of the model file ``path`` that keep
    their data in an external file, as onnx's external-data helpers list them (``"initializer"``
    of the graph and its subgraphs, then ``"tensor"`` of node attributes, functions' included).
    A binary model is walked field by field from a memory map, its weights never read (parsing
    a model of 192 MiB of inline weights cost 424 MiB to find it names none); a text model is
    read whole. Raises what :func:`read` raises for a file that holds no model."""
    with open(path, "rb") as fh:
        try:
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file: read says what it is
            mm = None
    if mm is not None:
        with mm, memoryview(mm) as buf:
            try:
                found = _walk_model(buf)
            except (ValueError, IndexError):  # no binary protobuf (UnicodeDecodeError included)
                found = None
        if found is not None:
            return found
    model = read(path, external=False)
    from onnx.external_data_helper import _get_attribute_tensors, _get_initializer_tensors, uses_external_data

    out = []
    for kind, tensors in (("initializer", _get_initializer_tensors(model)), ("tensor", _get_attribute_tensors(model))):
        for tensor in tensors:
            if uses_external_data(tensor):
                location = next((e.value for e in tensor.external_data if e.key == "location"), None)
                out.append((kind, tensor.name, location))
    return [t for t in out if t[2]]


def _walk_model(buf):
    """external_locations of a binary model, or None where ``buf`` holds no graph."""
    inits, attrs, graphs = [], [], 0
    top = list(fields(buf, 0, len(buf)))
    for field, wire, _, start, end in top:
        if field == 7 and wire == 2:
            graphs += 1
            _walk_graph(buf, start, end, inits, attrs)
    if not graphs:
        return None
    for field, wire, _, start, end in top:
        if field == 25 and wire == 2:  # onnx lists a function's attribute tensors only
            _walk_nodes(buf, [(s, e) for f, w, _, s, e in fields(buf, start, end) if f == 7 and w == 2], [], attrs)
    return [("initializer", *t) for t in inits if t[1]] + [("tensor", *t) for t in attrs if t[1]]


def _walk_graph(buf, start, end, inits, attrs):
    nodes = []
    for field, wire, _, s, e in fields(buf, start, end):
        if wire == 2 and field == 5:
            _tensor(buf, s, e, inits)
        elif wire == 2 and field == 1:
            nodes.append((s, e))
    _walk_nodes(buf, nodes, inits, attrs)  # a graph's own initializers first, as onnx lists them


def _walk_nodes(buf, nodes, inits, attrs):
    for start, end in nodes:
        for field, wire, _, s, e in fields(buf, start, end):
            if field != 5 or wire != 2:
                continue
            subgraphs = []
            for f, w, _, vs, ve in fields(buf, s, e):
                if w == 2 and f in (5, 10):
                    _tensor(buf, vs, ve, attrs)
                elif w == 2 and f in (6, 11):
                    subgraphs.append((vs, ve))
            for vs, ve in subgraphs:
                _walk_graph(buf, vs, ve, inits, attrs)


def _tensor(buf, start, end, out):
    """Append ``(name, location)`` of a TensorProto whose data is external to ``out``."""
    name, location, external = "", None, False
    for field, wire, _, s, e in fields(buf, start, end):
        if field == 8 and wire == 2:
            name = bytes(buf[s:e]).decode("utf-8")
        elif field == 14 and wire == 0:
            external = varint(buf, s)[0] == _EXTERNAL  # the last one written counts, as protobuf reads it
        elif field == 13 and wire == 2 and location is None:
            key, value = None, ""
            for f, w, _, vs, ve in fields(buf, s, e):
                if f in (1, 2) and w == 2:
                    text = bytes(buf[vs:ve]).decode("utf-8")
                    key, value = (text, value) if f == 1 else (key, text)
            if key == "location":
                location = value
    if external:
        out.append((name, location))

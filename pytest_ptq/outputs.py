"""Which tensors a metric is computed on: model outputs, intermediate tensors, or slices.

A slice is written like numpy indexing after a tensor name, ``"output0[:, 0:4]"``, and may
be named: ``"boxes=output0[:, :4]"``. A whole-tensor cosine of 0.999 can hide a collapse of
small-valued class scores beside large box coordinates; slicing them apart shows it.
"""

from __future__ import annotations

import dataclasses
import re

from .errors import PTQError, shown, unknown

_SLICE = re.compile(r"^\s*(?:(?P<alias>[^=\[\]]+?)\s*=\s*)?(?P<tensor>[^\[\]]+?)\s*(?:\[(?P<index>[^\]]*)\])?\s*$")


@dataclasses.dataclass(frozen=True)
class OutputSpec:
    """A named view on one tensor: ``name`` is what results are keyed by."""

    name: str
    tensor: str
    index: tuple = ()

    def take(self, array):
        return array[self.index] if self.index else array


def _parse_index(text, spec):
    parts = []
    for part in text.split(","):
        part = part.strip()
        try:
            if part == "...":
                parts.append(Ellipsis)
            elif ":" in part:
                bits = [int(b) if b.strip() else None for b in part.split(":")]
                if len(bits) > 3:
                    raise ValueError
                parts.append(slice(*bits))
            else:
                parts.append(int(part))
        except ValueError:
            raise PTQError(f"output slice {spec!r} has an index part {part!r} that is not an integer, "
                           "a start:stop[:step] slice or '...'; write it like 'output0[:, 0:4]'") from None
    return tuple(parts)


def parse_output(spec, qmodel):
    """An :class:`OutputSpec` for a tensor, normal node or slice description."""
    if isinstance(spec, OutputSpec):
        return spec
    m = _SLICE.match(str(spec))
    if not m:
        raise PTQError(f"output {spec!r} is not a tensor name or a slice like 'output0[:, 0:4]'")
    tensor = m.group("tensor")
    if tensor not in qmodel.producer and tensor not in qmodel.input_names:
        if tensor in qmodel.normal:
            tensor = qmodel.normal[tensor].outputs[0]
        else:
            raise unknown("output", tensor, qmodel.output_names + list(qmodel.normal))
    index = _parse_index(m.group("index"), spec) if m.group("index") is not None else ()
    name = m.group("alias") or (str(spec).strip() if index else tensor)
    return OutputSpec(name=name.strip(), tensor=tensor, index=index)


def parse_outputs(output_node, qmodel):
    """OutputSpecs for ``output_node`` (None = every float model output, or every output
    where none is float; a name; or a list)."""
    if output_node is None:
        # a bool mask or integer ids passed through carry no quantization error a metric
        # could weigh (cosine of a mask is 1 whatever happens), unless nothing else is there
        floats = [n for n in qmodel.output_names if qmodel.is_float_tensor(n)]
        specs = [OutputSpec(n, n) for n in floats or qmodel.output_names]
    else:
        if isinstance(output_node, (str, OutputSpec)):
            items = [output_node]
        elif isinstance(output_node, (list, tuple)) and all(isinstance(o, (str, OutputSpec)) for o in output_node):
            items = list(output_node)
        else:
            raise PTQError(f"output_node must be an output name, a slice such as 'out[:, 0:4]' or a list of them, "
                           f"got {shown(output_node)}")
        specs = [parse_output(o, qmodel) for o in items]
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise PTQError(f"output names {names} repeat; give each slice its own name with 'name=tensor[...]'")
    return specs

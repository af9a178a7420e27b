"""The re-quantized check (remedy/effect.py) on a tensor whose readers each read a pair of
their own (ModelOpt's, Quark's and some onnxruntime exports, ``DedicatedQDQPair``): both
pairs sit at the head of no chain (position 0) of one float tensor, and the check must tell
the pair the remedy names from its neighbour. Every expectation is read from the files'
protos directly: the chain of grids each operator reads."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import builders
from pytest_ptq.model import QuantModel

READERS = ("ma", "mb")


def _net(path, a=8, b=8, pairs=True):
    """x -> Relu -> t, read by Mul 'ma' through pair A and by Mul 'mb' through pair B, each of
    ``a`` / ``b`` bits (None: that Mul reads t float); ``pairs`` False: the float model."""
    inits = [numpy_helper.from_array(np.full([1, 4], 2, np.float32), "ca"),
             numpy_helper.from_array(np.full([1, 4], 3, np.float32), "cb")]
    nodes = [helper.make_node("Relu", ["x"], ["t"], name="relu")]
    read = {}
    for pair, bits, scale in (("A", a, 0.02), ("B", b, 0.05)):
        if bits is None or not pairs:
            read[pair] = "t"
        else:
            zero = np.uint8(0) if bits == 8 else np.uint16(0)
            read[pair] = builders.add_pair(inits, nodes, "t", scale * 2.0 ** (8 - bits), zero, name=f"{pair}{bits}")
    nodes += [helper.make_node("Mul", [read["A"], "ca"], ["ya"], name="ma"),
              helper.make_node("Mul", [read["B"], "cb"], ["yb"], name="mb")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info(y, TensorProto.FLOAT, [1, 4]) for y in ("ya", "yb")],
                              inits)
    return builders.save_model(graph, path)


def _bits_read(path, reader):
    """The bits of each pair operator ``reader`` reads its first input through, first to last,
    from the proto: DequantizeLinear back to its QuantizeLinear, the codes' type from the zero point."""
    model = onnx.load(str(path))
    written = {o: n for n in model.graph.node for o in n.output}
    inits = {i.name: i for i in model.graph.initializer}
    tensor, bits = next(n for n in model.graph.node if n.name == reader).input[0], []
    while tensor in written and written[tensor].op_type == "DequantizeLinear":
        dq = written[tensor]
        bits.insert(0, 8 * numpy_helper.to_array(inits[dq.input[2]]).itemsize)
        tensor = written[dq.input[0]].input[0]
    return bits


VARIANTS = {"A float": {"a": None}, "A int16": {"a": 16}, "B int16": {"b": 16}, "both int16": {"a": 16, "b": 16},
            "both float": {"a": None, "b": None}, "B float": {"b": None}}
APPLIED = {"float": lambda bits: bits == [], "int16": lambda bits: bits == [] or bits[0] >= 16}


def _expected(base, path, kind):
    """``(not_applied, collateral)`` read from the protos: pair A (read by 'ma') is named;
    collateral where 'mb' reads other grids than in the file without the remedy."""
    return ([] if APPLIED[kind](_bits_read(path, "ma")) else ["t"],
            ["t"] if _bits_read(path, "mb") != _bits_read(base, "mb") else [])


def _marked_by_quark(base, fpath, tmp_path):
    """File ``base`` marked as Quark's, read against float model ``fpath``."""
    from test_producer_terms import _mark

    model = onnx.load(str(base))
    _mark(model, "quark")
    onnx.save(model, str(tmp_path / "marked.onnx"))
    given = QuantModel(str(tmp_path / "marked.onnx"), float_model=str(fpath))
    assert given.made_by.key == "quark"
    return given


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("kind", ["float", "int16"])
def test_the_onnxruntime_check_tells_a_tensors_own_pairs_apart(tmp_path, variant, kind):
    """Keyed by float tensor and chain position, the two pairs of 't' were one place and the
    check compared whichever came last (B's): A left in float or raised read 'not applied', B
    raised in its stead 'applied', and B changed beside A went unsaid. Each pair is known by the
    operator it feeds now, the same in the file given and both re-quantized ones."""
    from pytest_ptq.remedy.requantize import _effect

    base, path = _net(tmp_path / "base.onnx"), _net(tmp_path / "after.onnx", **VARIANTS[variant])
    given = QuantModel(str(base))
    named = next(c.name for c in given.calibration.values() if given.feeds(c.name) == ["ma"])
    not_applied, collateral = _expected(base, path, kind)
    new = QuantModel(str(path)) if any(_bits_read(path, r) for r in READERS) else None  # None: nothing quantized
    found = _effect(given, QuantModel(str(base)), new, SimpleNamespace(nodes=[named], choices={}, remedy=kind))
    assert (found["not_applied"], found["collateral"]) == (not_applied, collateral), (variant, found)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_a_producers_check_tells_a_tensors_own_pairs_apart(tmp_path, variant):
    """The same two pairs in a file Quark made, its terms keeping A in float, read against the
    float model: the check compared B and read A, gone, as 'not applied'."""
    from pytest_ptq.remedy import producer_terms
    from pytest_ptq.remedy.producer_check import effect

    fpath = _net(tmp_path / "float.onnx", pairs=False)
    base, path = _net(tmp_path / "base.onnx"), _net(tmp_path / "after.onnx", **VARIANTS[variant])
    given = _marked_by_quark(base, fpath, tmp_path)
    named = next(c.name for c in given.calibration.values() if given.feeds(c.name) == ["ma"])
    terms = producer_terms(given, "float", [named], float_model=str(fpath))
    not_applied, collateral = _expected(base, path, "float")
    found = effect(terms, str(fpath), base, path)
    assert (found["not_applied"], found["collateral"]) == (not_applied, collateral), (variant, found)
    assert found["kept"]["float"] == {"t": not not_applied}


def _both_inputs_net(path, a=8, b=8, pairs=True):
    """x -> Relu -> t, read by one Add 'add' at both its inputs: input 0 through pair A, input 1
    through pair B, each of ``a`` / ``b`` bits (None: that input reads t float); ``pairs``
    False: the float model, Add(t, t). Both pairs: one float tensor, position 0, one reader."""
    inits = []
    nodes = [helper.make_node("Relu", ["x"], ["t"], name="relu")]
    read = []
    for pair, bits, scale in (("A", a, 0.02), ("B", b, 0.05)):
        if bits is None or not pairs:
            read.append("t")
        else:
            zero = np.uint8(0) if bits == 8 else np.uint16(0)
            read.append(builders.add_pair(inits, nodes, "t", scale * 2.0 ** (8 - bits), zero, name=f"{pair}{bits}"))
    nodes.append(helper.make_node("Add", read, ["y"], name="add"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], inits)
    return builders.save_model(graph, path)


def _bits_at(path, reader, index):
    """The bits of each pair ``reader`` reads its input ``index`` through, first to last, from
    the proto (as :func:`_bits_read`)."""
    model = onnx.load(str(path))
    written = {o: n for n in model.graph.node for o in n.output}
    inits = {i.name: i for i in model.graph.initializer}
    tensor, bits = next(n for n in model.graph.node if n.name == reader).input[index], []
    while tensor in written and written[tensor].op_type == "DequantizeLinear":
        dq = written[tensor]
        bits.insert(0, 8 * numpy_helper.to_array(inits[dq.input[2]]).itemsize)
        tensor = written[dq.input[0]].input[0]
    return bits


def _pair_at(qm, path, reader, index):
    """The pair of ``qm`` whose DequantizeLinear operator ``reader`` of file ``path`` reads at
    input ``index``, found in the proto."""
    nodes = onnx.load(str(path)).graph.node
    written = {o: n for n in nodes for o in n.output}
    dq = written[next(n for n in nodes if n.name == reader).input[index]].name
    return next(c.name for c in qm.calibration.values() if dq in {d.name for d in c.dq_nodes})


def _expected_at(base, path, kind):
    """``(not_applied, collateral)`` read from the protos: the pair the Add reads at input 0
    (A) is named; collateral where input 1 reads other grids than without the remedy."""
    return ([] if APPLIED[kind](_bits_at(path, "add", 0)) else ["t"],
            ["t"] if _bits_at(path, "add", 1) != _bits_at(base, "add", 1) else [])


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("kind", ["float", "int16"])
def test_the_onnxruntime_check_tells_apart_the_pairs_one_operator_reads_at_two_inputs(tmp_path, variant, kind):
    """Add(t through A, t through B): the two pairs share float tensor, chain position and
    reader, and keyed by those they were one place, the check comparing whichever came last.
    Each is known by the Add's input it feeds now, the same in every file made of Add(t, t)."""
    from pytest_ptq.remedy.requantize import _effect

    base, path = _both_inputs_net(tmp_path / "base.onnx"), _both_inputs_net(tmp_path / "after.onnx", **VARIANTS[variant])
    given = QuantModel(str(base))
    named = _pair_at(given, base, "add", 0)
    not_applied, collateral = _expected_at(base, path, kind)
    new = QuantModel(str(path)) if any(_bits_at(path, "add", i) for i in (0, 1)) else None  # None: nothing quantized
    found = _effect(given, QuantModel(str(base)), new, SimpleNamespace(nodes=[named], choices={}, remedy=kind))
    assert (found["not_applied"], found["collateral"]) == (not_applied, collateral), (variant, found)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_a_producers_check_tells_apart_the_pairs_one_operator_reads_at_two_inputs(tmp_path, variant):
    """The same Add in a file Quark made, its terms keeping the pair of input 0 in float, read
    against the float model Add(t, t), through the terms as JSON holds them."""
    import json

    from pytest_ptq.remedy import producer_terms
    from pytest_ptq.remedy.producer_check import effect

    fpath = _both_inputs_net(tmp_path / "float.onnx", pairs=False)
    base, path = _both_inputs_net(tmp_path / "base.onnx"), _both_inputs_net(tmp_path / "after.onnx", **VARIANTS[variant])
    given = _marked_by_quark(base, fpath, tmp_path)
    named = _pair_at(given, base, "add", 0)
    terms = json.loads(json.dumps(producer_terms(given, "float", [named], float_model=str(fpath))))
    not_applied, collateral = _expected_at(base, path, "float")
    found = effect(terms, str(fpath), base, path)
    assert (found["not_applied"], found["collateral"]) == (not_applied, collateral), (variant, found)


def test_the_check_of_a_remedy_naming_thousands_of_pairs_grows_with_them_not_their_square():
    """A mixed remedy on a large model names thousands of pairs among thousands: each place is
    looked up by its tensor and position, not through every pair of the file (which took ~13 s
    for 2000 named among 4000 on one core). The outcome against the files' chains read directly:
    the named pairs left in float are applied, one named pair kept quantized is not, and a pair
    not named whose grid changed is collateral."""
    import time

    from pytest_ptq.remedy.effect import changes

    n, named = 4000, 2000
    before = {(f"t{i}", 0, ((f"op{i}", 0),)): SimpleNamespace(bit=8, per_channel=False) for i in range(n)}
    keys = list(before)
    after = {k: SimpleNamespace(bit=8, per_channel=False) for k in keys[named:]}
    after[keys[0]] = SimpleNamespace(bit=8, per_channel=False)  # named, yet still quantized
    after[keys[-1]] = SimpleNamespace(bit=16, per_channel=False)  # not named, yet raised
    start = time.perf_counter()
    found = changes(before, after, {"float": keys[:named]})
    took = time.perf_counter() - start
    assert found["not_applied"] == [keys[0][0]]
    assert found["collateral"] == [keys[-1][0]]
    assert sum(found["kept"]["float"].values()) == named - 1
    assert took < 3.0, f"{took:.1f} s"

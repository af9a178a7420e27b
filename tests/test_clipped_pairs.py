"""Pairs whose codes go through an integer Clip between QuantizeLinear and DequantizeLinear:
PyTorch's QAT export writes its (0, 127) activation range so (a Clip to a uint8 127 from a
Constant, no lower bound), Brevitas its sub-8-bit grids (QCDQ: a Clip to [-8, 7] in int8).

Each is one fake-quant on the narrower grid. The references are independent: the same net
built with onnx.helper with only some pairs written, run in plain onnxruntime sessions.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import builders
from pytest_ptq.engine import Engine
from pytest_ptq.model import QuantModel
from pytest_ptq.sensitivity import get_sensitivity_of_nodes

PAIRS = ("x", "w", "r")  # the input, the conv weight, the relu output
# style: {pair: (code type, zero point, scale, clip low, clip high)}; a bound of None is left
# out of the Clip (PyTorch writes no lower bound)
STYLES = {
    "torch": {"x": (TensorProto.UINT8, 64, 0.03, None, 127), "w": (TensorProto.INT8, 0, 0.02, None, None),
              "r": (TensorProto.UINT8, 0, 0.025, None, 127)},
    "brevitas": {"x": (TensorProto.INT8, 0, 0.3, -8, 7), "w": (TensorProto.INT8, 0, 0.12, -7, 7),
                 "r": (TensorProto.INT8, 0, 0.4, -8, 7)},
}


def clipped_net(path, style, keep=PAIRS, size=8):
    """A conv + relu net with the pairs in ``keep`` written as ``style`` writes them (Q, an
    integer Clip where the style narrows the grid, DQ) and the others left out."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array((rng.standard_normal((6, 3, 3, 3)) * 0.3).astype(np.float32), "w")]
    nodes = []

    def pair(name, src):
        if name not in keep:
            return src
        qtype, zp, scale, lo, hi = STYLES[style][name]
        np_type = helper.tensor_dtype_to_np_dtype(qtype)
        inits.extend([numpy_helper.from_array(np.array(scale, np.float32), f"{name}_s"),
                      numpy_helper.from_array(np.array(zp, np_type), f"{name}_z")])
        nodes.append(helper.make_node("QuantizeLinear", [src, f"{name}_s", f"{name}_z"], [f"{name}_q"], name=f"{name}_Q"))
        codes = f"{name}_q"
        if (lo, hi) != (None, None):
            bounds = []
            for side, value in (("lo", lo), ("hi", hi)):
                if value is None:
                    bounds.append("")
                elif style == "torch":  # a Constant node, as the exporter writes it
                    nodes.append(helper.make_node("Constant", [], [f"{name}_{side}"],
                                                  value=numpy_helper.from_array(np.array(value, np_type))))
                    bounds.append(f"{name}_{side}")
                else:
                    inits.append(numpy_helper.from_array(np.array(value, np_type), f"{name}_{side}"))
                    bounds.append(f"{name}_{side}")
            nodes.append(helper.make_node("Clip", [codes, *bounds], [f"{name}_c"], name=f"{name}_Clip"))
            codes = f"{name}_c"
        nodes.append(helper.make_node("DequantizeLinear", [codes, f"{name}_s", f"{name}_z"], [f"{name}_dq"],
                                      name=f"{name}_DQ"))
        return f"{name}_dq"

    x = pair("x", "x")
    w = pair("w", "w")
    nodes.append(helper.make_node("Conv", [x, w], ["c"], name="conv", pads=[1, 1, 1, 1]))
    nodes.append(helper.make_node("Relu", ["c"], ["relu_out"], name="relu"))
    r = pair("r", "relu_out")
    nodes.append(helper.make_node("GlobalAveragePool", [r], ["y"], name="pool"))
    graph = helper.make_graph(nodes, "clipped", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                [1, 3, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 1, 1])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="pytorch")
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module", params=sorted(STYLES))
def net(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"clipped_{request.param}")
    samples = builders.samples(4, size=8, seed=2)
    builders.save_folder(samples, root / "calib")
    return {"style": request.param, "root": root, "feeds": [{"x": a} for a in samples["x"]],
            "model": clipped_net(root / "model.onnx", request.param)}


def _lonely(net, keep):
    return clipped_net(net["root"] / f"keep_{'_'.join(keep) or 'none'}.onnx", net["style"], keep)


def _run(model, net):
    """Plain onnxruntime at its default level without the NCHWc layout, as the engine compiles
    a form with its pairs inline (Q/DQ fake-quant in both): a conv's summation order otherwise
    differs, and a value on a code boundary can round the other way."""
    return [o["y"] for o in builders.run_model(model, net["feeds"], level="all",
                                               disabled_optimizers=("NchwcTransformer",))]


def test_a_clipped_pair_is_one_pair_on_the_narrower_grid(net):
    qm = QuantModel(str(net["model"]))
    assert sorted(qm.calibration) == ["r_Q", "w_Q", "x_Q"]
    assert set(qm.normal) == {"conv", "relu", "pool"}  # the Clips belong to their pairs
    for name, (qtype, _, scale, lo, hi) in STYLES[net["style"]].items():
        c = qm.calibration[f"{name}_Q"]
        full = np.iinfo(helper.tensor_dtype_to_np_dtype(qtype))
        want = (full.min if lo is None else lo, full.max if hi is None else hi)
        assert c.qrange == want and c.grid.levels == want[1] - want[0] + 1
        assert c.bit == int(np.ceil(np.log2(want[1] - want[0] + 1)))
        # the numpy fake-quant is onnxruntime's Q, Clip, DQ on the same values
        x = np.linspace(-12, 12, 2001, dtype=np.float32).reshape(1, 1, 1, -1) * scale * 10
        stored = onnx.load(str(net["model"])).graph
        one = helper.make_model(helper.make_graph(
            [n for n in stored.node if n.output[0].startswith(f"{name}_")], "one",
            [helper.make_tensor_value_info(c.input, TensorProto.FLOAT, None)],
            [helper.make_tensor_value_info(f"{name}_dq", TensorProto.FLOAT, None)],
            [i for i in stored.initializer if i.name.startswith(f"{name}_")]), opset_imports=[helper.make_opsetid("", 13)])
        np.testing.assert_array_equal(c.fake_quant(x), builders.run_model(one, {c.input: x})[f"{name}_dq"])


def test_bypassed_and_quantized_runs_are_the_nets_without_and_with_the_pairs(net):
    engine = Engine(str(net["model"]), net["root"] / "calib")
    for i, (f, q) in enumerate(zip(_run(_lonely(net, ()), net), _run(net["model"], net))):
        np.testing.assert_allclose(engine.run(i, ())["y"], f, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(engine.run(i, "all")["y"], q, rtol=1e-5, atol=1e-6)
    assert not engine.warnings


def test_each_clipped_pairs_sensitivity_is_the_net_with_that_pair_alone(net):
    engine = Engine(str(net["model"]), net["root"] / "calib")
    sens = {**get_sensitivity_of_nodes(engine, node_type="weight"), **get_sensitivity_of_nodes(engine, node_type="activation")}
    ref = _run(_lonely(net, ()), net)
    for name in PAIRS:
        alone = _run(_lonely(net, (name,)), net)
        assert sens[f"{name}_Q"]["cosine-similarity"] == pytest.approx(builders.pooled_cosine(ref, alone), abs=1e-6)
    # the narrow grids cost something: the check would pass were the Clips ignored
    assert min(v["cosine-similarity"] for v in sens.values()) < 0.9999


def test_a_clip_that_is_no_grid_is_an_ordinary_node_or_one_sentence(tmp_path):
    """Bounds that cross (no code left) are one sentence naming the Clip; a Clip whose bounds
    are computed, or whose output the model also returns, is not part of a pair."""
    from pytest_ptq.errors import PTQError

    path = clipped_net(tmp_path / "m.onnx", "brevitas")
    model = onnx.load(str(path))
    for init in model.graph.initializer:
        if init.name == "x_lo":
            init.CopyFrom(numpy_helper.from_array(np.array(9, np.int8), "x_lo"))
    onnx.save(model, str(tmp_path / "crossed.onnx"))
    with pytest.raises(PTQError, match=r"^node 'x_Clip' of '.*crossed.onnx' clips the int8 codes to an empty range "
                                        r"\[9, 7\]; check the export$"):
        QuantModel(str(tmp_path / "crossed.onnx"))
    model = onnx.load(str(path))
    model.graph.output.append(helper.make_tensor_value_info("x_c", TensorProto.INT8, None))
    onnx.save(model, str(tmp_path / "exposed.onnx"))
    qm = QuantModel(str(tmp_path / "exposed.onnx"))
    assert "x_Q" not in qm.calibration and "x_Clip" in qm.normal and "w_Q" in qm.calibration

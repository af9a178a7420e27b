"""The CUDA provider path (onnxruntime-gpu): where CUDA is available, the engine on CUDA gives
the CPU's rankings. Skipped on machines without it; the product never needs a GPU."""

from __future__ import annotations

import onnxruntime as ort
import pytest

import builders
from pytest_ptq.engine import Engine
from pytest_ptq.sensitivity import get_sensitivity_of_nodes

pytestmark = pytest.mark.skipif("CUDAExecutionProvider" not in ort.get_available_providers(),
                                reason="onnxruntime here has no CUDAExecutionProvider (install onnxruntime-gpu "
                                       "on a machine with CUDA to run this)")

CPU = ["CPUExecutionProvider"]
CUDA = ["CUDAExecutionProvider", "CPUExecutionProvider"]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("cuda")
    data = builders.samples(4)
    folder = builders.save_folder(data, root / "calib")
    narrow = {k: [a * 0.1 for a in v] for k, v in data.items()}
    q = builders.quantize(builders.conv_net(root / "float.onnx", outlier_channel=3), root / "q.onnx", narrow)
    return q, folder


@pytest.mark.parametrize("node_type", ["weight", "activation", "node"])
def test_cuda_gives_the_cpu_rankings(model, node_type):
    q, folder = model
    cpu = get_sensitivity_of_nodes(Engine(q, folder, providers=CPU), node_type=node_type)
    cuda_engine = Engine(q, folder, providers=CUDA)
    assert "CUDAExecutionProvider" in cuda_engine.session().get_providers()
    cuda = get_sensitivity_of_nodes(cuda_engine, node_type=node_type)
    assert list(cuda) == list(cpu)
    for name in cpu:
        # kernels differ in summation order: a value moves, the ranking does not
        assert cuda[name]["cosine-similarity"] == pytest.approx(cpu[name]["cosine-similarity"], abs=1e-4), name


def test_cuda_fully_quantized_output_matches_cpu(model):
    q, folder = model
    import numpy as np

    cpu, cuda = Engine(q, folder, providers=CPU), Engine(q, folder, providers=CUDA)
    for i in range(len(cpu.data)):
        a, b = cpu.run(i, "all"), cuda.run(i, "all")
        for name in a:
            x, y = np.ravel(a[name]).astype(np.float64), np.ravel(b[name]).astype(np.float64)
            assert x @ y / np.sqrt((x @ x) * (y @ y)) > 0.9999, name

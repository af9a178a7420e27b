"""The CUDA provider path (onnxruntime-gpu): where CUDA is available, the engine on CUDA gives
the CPU's rankings. Skipped on machines without it; the product never needs a GPU."""

from __future__ import annotations

import pytest

import builders
from pytest_ptq.errors import PTQError
from pytest_ptq.engine import Engine
from pytest_ptq.engine.runtime import cuda_usable
from pytest_ptq.sensitivity import get_sensitivity_of_nodes

needs_cuda = pytest.mark.skipif(not cuda_usable(),
                                reason="onnxruntime's CUDAExecutionProvider does not run here (install "
                                       "onnxruntime-gpu on a machine with CUDA to run this)")

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


@needs_cuda
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


@needs_cuda
def test_cuda_fully_quantized_output_matches_cpu(model):
    q, folder = model
    import numpy as np

    cpu, cuda = Engine(q, folder, providers=CPU), Engine(q, folder, providers=CUDA)
    for i in range(len(cpu.data)):
        a, b = cpu.run(i, "all"), cuda.run(i, "all")
        for name in a:
            x, y = np.ravel(a[name]).astype(np.float64), np.ravel(b[name]).astype(np.float64)
            assert x @ y / np.sqrt((x @ x) * (y @ y)) > 0.9999, name



def test_a_listed_cuda_provider_that_does_not_run_leaves_the_cpu(monkeypatch):
    """onnxruntime-gpu lists CUDA wherever it is installed; without a GPU a session asked for
    it falls back to the CPU, so the engine must not ask for it on the listing alone."""
    import onnxruntime

    from pytest_ptq.engine import runtime

    listed = onnxruntime.get_available_providers()
    if "CUDAExecutionProvider" in listed:
        pytest.skip("onnxruntime here has the CUDA provider: nothing to pretend")
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CUDAExecutionProvider", *listed])
    monkeypatch.delenv("PTQ_PROVIDERS", raising=False)
    runtime.cuda_usable.cache_clear()
    try:
        assert runtime.cuda_usable() is False
        assert runtime.default_providers() == ["CPUExecutionProvider"]
        # asked for by name, it is refused rather than quietly run on the CPU
        with pytest.raises(PTQError, match="CUDAExecutionProvider is installed but does not run here"):
            runtime.asked_providers(["CUDAExecutionProvider", "CPUExecutionProvider"])
    finally:
        runtime.cuda_usable.cache_clear()


def test_a_provider_this_onnxruntime_lacks_is_refused_and_one_name_is_one_provider():
    from pytest_ptq.engine import runtime

    with pytest.raises(PTQError, match="execution provider NoSuchExecutionProvider is not in this onnxruntime"):
        runtime.asked_providers(["NoSuchExecutionProvider"])
    assert runtime.asked_providers("CPUExecutionProvider") == ["CPUExecutionProvider"]
    assert runtime.asked_providers(None) is None

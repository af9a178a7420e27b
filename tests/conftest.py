"""Shared fixtures: tiny float models, their QDQ quantizations and calibration data.

Models are built once per test session (per xdist worker) in a temp folder and only on
first use, so a test run pays for the variants it touches.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
for _p in (str(HERE.parent), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import builders  # noqa: E402

# pytester's in-process runs drop the modules a run imported; importing the plugin's
# modules here keeps one copy of each, so their classes stay the same between runs.
import pytest_ptq.analysis  # noqa: E402,F401
import pytest_ptq.checks  # noqa: E402,F401
import pytest_ptq.contract  # noqa: E402,F401

# name -> (conv_net keyword arguments, quantize keyword arguments)
RECIPES = {
    # float weights behind Q/DQ pairs, Relu kept: every pair can be bypassed
    "qdq": ({}, {}),
    "qdq_pc": ({}, {"per_channel": True}),
    # onnxruntime defaults: weights stored quantized (lone DQ), Relu folded and deleted
    "default": ({}, {"keep_float": False}),
    "default_pc": ({}, {"keep_float": False, "per_channel": True}),
    # weights stored quantized but Relu kept: lone-DQ weights without the folding trap
    "dq_weights": ({}, {"keep_float": False, "extra_options": {"QDQKeepRemovableActivations": True}}),
    "dq_weights_pc": ({}, {"keep_float": False, "per_channel": True,
                           "extra_options": {"QDQKeepRemovableActivations": True}}),
    "int8": ({}, {"activation_type": "QInt8"}),
    "int16": ({}, {"activation_type": "QInt16"}),
    "uint16": ({}, {"activation_type": "QUInt16"}),
    "two_outputs": ({"two_outputs": True}, {}),
    "two_inputs": ({"two_inputs": True}, {}),
    "unnamed": ({"unnamed": True}, {}),
}
N_SAMPLES = 4


class Zoo:
    """Lazily built models: ``zoo.qdq(name)`` is a QDQ model path, ``zoo.float(name)`` the
    float model it came from, ``zoo.data(name)`` its calibration data ``{input: [arrays]}``."""

    def __init__(self, root):
        self.root = root
        self._built = {}

    def _net_key(self, name):
        net = RECIPES[name][0]
        return "float_" + ("_".join(sorted(net)) or "plain")

    def float(self, name="qdq"):
        key = self._net_key(name)
        if key not in self._built:
            self._built[key] = builders.conv_net(self.root / f"{key}.onnx", **RECIPES[name][0])
        return self._built[key]

    def data(self, name="qdq"):
        names = ("x", "y") if RECIPES[name][0].get("two_inputs") else ("x",)
        return builders.samples(N_SAMPLES, names=names)

    def folder(self, name="qdq"):
        key = "data_" + self._net_key(name)
        if key not in self._built:
            self._built[key] = builders.save_folder(self.data(name), self.root / key)
        return self._built[key]

    def qdq(self, name="qdq"):
        if name not in self._built:
            self._built[name] = builders.quantize(self.float(name), self.root / f"{name}.onnx",
                                                  self.data(name), **RECIPES[name][1])
        return self._built[name]


@pytest.fixture(scope="session")
def zoo(tmp_path_factory):
    return Zoo(tmp_path_factory.mktemp("zoo"))


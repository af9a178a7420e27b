"""onnxruntime as the engine uses it: providers, session options, sessions and their errors.

This is the one module that creates onnxruntime sessions and turns their failures into a
:class:`~pytest_ptq.errors.PTQError` that quotes onnxruntime's own words (the node and the
reason), so every analysis reports a failure the same way.
"""

from __future__ import annotations

import os

from ..errors import PTQError, unknown

LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC",
          "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}


def ort():
    """The onnxruntime module, imported on first use (pytest start-up does not load it)."""
    import onnxruntime

    return onnxruntime


def default_providers():
    """CUDA when onnxruntime has it (and PTQ_PROVIDERS does not say otherwise), else CPU."""
    env = os.environ.get("PTQ_PROVIDERS")
    if env:
        return [p.strip() for p in env.split(",") if p.strip()]
    if "CUDAExecutionProvider" in ort().get_available_providers():
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def check_level(optimization):
    """Reject an unknown graph optimisation level before any work is done."""
    if not isinstance(optimization, str) or optimization not in LEVELS:
        raise unknown("optimization level", optimization, list(LEVELS))
    return optimization


def session_options(optimization="all", fake_quant=True, optimized_path=None, libraries=()):
    """SessionOptions at the given optimisation level.

    ``fake_quant`` keeps Q/DQ as float arithmetic (onnxruntime's QDQ-to-integer fusion off),
    which is what every analysis simulates; False lets onnxruntime fuse Q/DQ into its integer
    kernels (the "integer" stage). ``optimized_path``: where onnxruntime writes the optimised
    model. ``libraries``: custom-op libraries (shared objects) to register.
    """
    rt = ort()
    so = rt.SessionOptions()
    so.graph_optimization_level = getattr(rt.GraphOptimizationLevel, LEVELS[check_level(optimization)])
    if fake_quant:
        so.add_session_config_entry("session.disable_quant_qdq", "1")
    # An engine holds many sessions run one after another: threads left spinning by one
    # starve the next (measured: a float pass 6x slower with spinning on).
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    if optimized_path is not None:
        so.optimized_model_filepath = str(optimized_path)
    for lib in libraries:
        try:
            so.register_custom_ops_library(str(lib))
        except Exception as exc:
            raise PTQError(f"onnxruntime cannot load the custom-op library {str(lib)!r} ({first_line(exc)}); check "
                           "that it was built for this onnxruntime and that its own dependencies load") from None
    so.log_severity_level = 3
    return so


def first_line(exc):
    """The first line of an exception's message, or its type name."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def make_session(model, optimization="all", providers=None, fake_quant=True, optimized_path=None,
                 what="the model", libraries=()):
    """An onnxruntime session for a ModelProto; a failure is one sentence quoting onnxruntime."""
    options = session_options(optimization, fake_quant, optimized_path, libraries)
    try:
        return ort().InferenceSession(model.SerializeToString(), options, providers=providers or default_providers())
    except PTQError:
        raise
    except Exception as exc:
        raise PTQError(f"onnxruntime cannot load {what} ({first_line(exc)}); check that it runs in a plain "
                       "onnxruntime session") from None


def run(session, names, feeds, source):
    """``session.run(names, feeds)``; a failure names the model and quotes onnxruntime."""
    try:
        return session.run(names, feeds)
    except Exception as exc:
        raise run_error(exc, source) from None


def run_error(exc, source):
    """A PTQError for onnxruntime failing to run ``source``: its own message first, then what
    to check (the data only when onnxruntime complains about an input)."""
    msg = first_line(exc)
    low = msg.lower()
    if any(k in low for k in ("invalid rank for input", "got invalid dimensions for input",
                              "unexpected input data type", "input name", "missing input")):
        hint = "check the data's shapes and dtypes against the model's inputs"
    else:
        hint = "the model does not run as stored in onnxruntime; check it in a plain onnxruntime session"
    return PTQError(f"onnxruntime failed to run {source!r}: {msg}; {hint}")

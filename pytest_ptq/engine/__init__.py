"""The engine package: a calibrated model compiled once and run under any config.

- :mod:`.runtime`: onnxruntime providers, session options, sessions and their errors (the
  one place that creates sessions);
- :mod:`.instrument`: the QDQ graph rewritten into a gated graph (ModelProto -> ModelProto);
- :mod:`.segments`: the gated graph cut into a chain of sessions that reuse the float prefix;
- :mod:`.core`: :class:`Engine`, the public surface every analysis uses.
"""

from .core import Engine, engine_for
from .runtime import default_providers, make_session, session_options

__all__ = ["Engine", "engine_for", "default_providers", "make_session", "session_options"]

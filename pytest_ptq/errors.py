"""Errors the user can act on.

Every error raised on bad input is a :class:`PTQError` whose message is one sentence
naming the file, node or input at fault and what to do; the CLI prints it and exits 2.
"""

import os
import sys
import traceback

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep

# How to pass the float model on every face, for messages raised below all of them
FLOAT_MODEL_OPTION = ("float_model= in Python, float_model: in a contract, --float-model to ptq-debug, "
                      "--ptq-float-model to pytest")


class PTQError(ValueError):
    """Bad input or an unsupported model: the message says what to do."""


class RunFailed(PTQError):
    """onnxruntime failed to run ``source``: its ``quoted`` words are kept for a caller who
    knows more than the run did (which sample, whose feeds)."""

    def __init__(self, message, source, quoted):
        super().__init__(message)
        self.source, self.quoted = source, quoted


class ModelFailed(RunFailed):
    """onnxruntime failed inside the model with nothing in its words pointing at the data
    (a kernel refusing the shapes it was handed, say): the sample's shapes may say more."""


class InputRefused(RunFailed):
    """onnxruntime refused a run's inputs (a shape, rank, dtype or name it does not take);
    ``given``: what the feeds held where the model takes otherwise ("" where that is not read
    from them), for a caller who knows whose feeds they were (an evaluation function's, not
    the data's files)."""

    given = ""


class PTQWarning(UserWarning):
    """What the analyses warn of (data, outputs, the cache): the run goes on."""


class NotQuantized(PTQError):
    """The model holds nothing the tool can analyse as quantized (a float model, say)."""


class NotFloatEquivalent(PTQError):
    """The model with every Q/DQ pair bypassed is not its float model, so nothing can be
    measured against it (a Relu folded and deleted, another float model given)."""


class NonFinite(PTQError):
    """The model's float arithmetic gives NaN or infinity on a sample (data it overflows on, a
    float16 graph past its range), so nothing can be measured against it there."""


def as_sentence(exc):
    """The one sentence of ``exc`` where it is a :class:`PTQError`, or one of pytest-ptq's
    warnings raised as an error (``-W error``, ``filterwarnings = error``); else None."""
    if isinstance(exc, PTQError):
        return str(exc)
    if isinstance(exc, Warning) and type(exc).__module__.split(".")[0] == __name__.split(".")[0]:
        return f"{exc} (warnings are errors in this run)"
    return None


def user_level():
    """The ``stacklevel`` that makes a warning raised by the function calling this name the
    first caller outside pytest-ptq (the user's line), however deep in the package it is."""
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level


_SHOWN = 80


def shown(value, limit=_SHOWN):
    """``repr(value)`` cut to about ``limit`` characters, for messages.

    reprlib bounds the work as well as the text: a YAML alias bomb expands to a structure
    whose full repr would take gigabytes, and a message must not be what hangs the run.
    """
    if isinstance(value, str):
        # reprlib cuts the escaped text where the raw one would be cut: a name of control
        # characters or undecodable bytes read twice over ('..._QuantizeLinearizeLinear')
        whole = repr(value) if len(value) <= 4 * limit else ""
        if whole and len(whole) <= limit:
            return whole
        k = limit // 2  # characters kept at each end, escaped whole, quoted once
        while True:  # "\uffff" marks the cut: repr escapes it, a name never holds it
            text = repr(value[:k] + "\uffff" + value[-k:]).replace("\\uffff", "...", 1)
            if len(text) <= limit or k == 1:
                return text
            k -= 1
    import reprlib

    r = reprlib.Repr()
    r.maxlevel, r.maxdict, r.maxlist, r.maxtuple, r.maxset = 3, 4, 6, 6, 6
    r.maxstring, r.maxother, r.maxlong = limit, limit, 40
    # one line: numpy's repr of an array breaks before its dtype, some versions' within it too
    text = " ".join(r.repr(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def clip(text, limit=_SHOWN):
    """Plain ``text`` (a message quoted from elsewhere) cut to ``limit`` characters."""
    text = str(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def closest(name, candidates, n=3, cutoff=0.4):
    """Up to ``n`` names from ``candidates`` that look like ``name`` (difflib's ratio at least
    ``cutoff``), best first."""
    import difflib

    return difflib.get_close_matches(str(name), list(candidates), n=n, cutoff=cutoff)


def unknown(kind, name, candidates, usual=()):
    """A PTQError for an unknown ``kind`` called ``name``, suggesting the closest names (among
    the ``usual`` ones first: a model's outputs, say, which it then lists)."""
    fits = isinstance(name, str) and len(name) <= 200
    # beside the usual names, another must look much alike: a weak match is an internal name
    near = (closest(name, usual) or closest(name, candidates, cutoff=0.8 if usual else 0.4)) if fits else []
    hint = f"; did you mean {', '.join(shown(c) for c in near)}?" if near else ""
    if usual:
        from .tables import listed

        hint += f"; the model's {kind}s are {listed(usual, shown=5)}"
    elif not near and kind == "node":
        hint = "; known nodes are listed by `ptq-debug list-nodes`"
    elif not near and len(candidates) <= 12:  # a short menu (metrics, remedies): all of it
        hint = "; use one of " + ", ".join(shown(c) for c in candidates)
    return PTQError(f"unknown {kind} {shown(name)}{hint}")


def raised_by_user(what, exc):
    """The PTQError for ``exc`` raised by the user's code ``what`` ("the evaluation function
    top1"), naming the last line of theirs it passed through (file:line), not our frames. An
    :class:`InputRefused` is onnxruntime refusing the feeds that code built and handed to
    ``run()`` on that line: what it passed is at fault there, not the data's files."""
    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not os.path.abspath(f.filename).startswith(package)]
    at = f" at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno}" if frames else ""
    if isinstance(exc, InputRefused):
        given = f": it passed {exc.given}" if exc.given else ""
        return PTQError(f"{what} called run(){at} with feeds onnxruntime refuses for {exc.source!r} ({exc.quoted})"
                        f"{given}; make the feeds it builds fit the model's inputs (one sample per run where the "
                        "model's batch axis is fixed)")
    return PTQError(f"{what} raised {type(exc).__name__}{at}: {clip(str(exc))}; fix it and run again")

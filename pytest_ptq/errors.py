"""Errors the user can act on.

Every error raised on bad input is a :class:`PTQError` whose message is one sentence
naming the file, node or input at fault and what to do; the CLI prints it and exits 2.
"""


class PTQError(ValueError):
    """Bad input or an unsupported model: the message says what to do."""


class NotQuantized(PTQError):
    """The model holds nothing the tool can analyse as quantized (a float model, say)."""


_SHOWN = 80


def shown(value, limit=_SHOWN):
    """``repr(value)`` cut to about ``limit`` characters, for messages.

    reprlib bounds the work as well as the text: a YAML alias bomb expands to a structure
    whose full repr would take gigabytes, and a message must not be what hangs the run.
    """
    import reprlib

    r = reprlib.Repr()
    r.maxlevel, r.maxdict, r.maxlist, r.maxtuple, r.maxset = 3, 4, 6, 6, 6
    r.maxstring, r.maxother, r.maxlong = limit, limit, 40
    text = r.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def clip(text, limit=_SHOWN):
    """Plain ``text`` (a message quoted from elsewhere) cut to ``limit`` characters."""
    text = str(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def closest(name, candidates, n=3):
    """Up to ``n`` names from ``candidates`` that look like ``name``, best first."""
    import difflib

    return difflib.get_close_matches(str(name), list(candidates), n=n, cutoff=0.4)


def unknown(kind, name, candidates, usual=()):
    """A PTQError for an unknown ``kind`` called ``name``, suggesting the closest names, else
    the ``usual`` ones (a model's outputs, say)."""
    near = closest(name, candidates) if isinstance(name, str) and len(name) <= 200 else []
    if near:
        hint = f"; did you mean {', '.join(shown(c) for c in near)}?"
    elif usual:
        from .tables import listed

        hint = f"; the model's {kind}s are {listed(usual, shown=5)}"
    else:
        hint = f"; known {kind}s are listed by `ptq-debug list-nodes`" if kind == "node" else ""
    return PTQError(f"unknown {kind} {shown(name)}{hint}")

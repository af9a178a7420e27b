"""A termination signal (SIGTERM: a CI time limit's, ``kill``, a container stopping) ends a
run as Ctrl-C does.

Python's default for SIGTERM ends the process at once: no ``finally`` block or ``with``
exit runs, so a killed run left its temporary folders (re-quantized models, the report's
figures) behind and its report page saying it had not finished. Within :func:`as_interrupt`
the signal raises :class:`Terminated`, a KeyboardInterrupt, so that everything that already
cleans up after Ctrl-C (the temporary folders, runall's unfinished summary, pytest's
interrupted exit and the plugin's interrupted page) does so after SIGTERM too.
"""

from __future__ import annotations

import contextlib
import signal
import threading

# Exit status of a command ended by SIGTERM, as a shell reports one the signal killed.
EXIT_STATUS = 128 + signal.SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived (see :func:`as_interrupt`)."""


def _raise(signum, frame):
    # A second signal ends the process at once (the default again), as one sent by someone
    # who will not wait for the clean-up (a CI limit's SIGTERM, then its SIGKILL, alike).
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise Terminated("terminated by SIGTERM")


@contextlib.contextmanager
def as_interrupt():
    """Within the block, SIGTERM raises :class:`Terminated` in the main thread, where the
    process still has Python's default for it (see :func:`install`); the default comes back
    after the block."""
    ours = install()
    try:
        yield ours
    finally:
        if ours:
            restore()


def install():
    """Make SIGTERM raise :class:`Terminated` from now until :func:`restore` (a pytest session,
    which is no one block); returns whether it did. A handler someone else installed is
    kept; off the main thread, which alone may set one, nothing changes."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        return False
    signal.signal(signal.SIGTERM, _raise)
    return True


def restore():
    """Python's default for SIGTERM again, where the handler is still ours."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is _raise:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

"""Configs run side by side: a few threads, each running one config's segment chain.

A ranking runs hundreds of configs of the same sample, each a short chain of small
segments. onnxruntime spreads one run over every core, but a small segment's operators
are too short to split well and its threads sleep between them (spinning is off, see
:func:`.runtime.session_options`), so one run at a time leaves cores idle. Several configs
in flight fill them, each segment session on its share of the cores (one each on two);
whole-graph sessions keep the process's threads, since they serve runs made one at a time
(whole-group configs, a feed dict's float run; see :meth:`.segments.Segments.run`).
Measured on 2 cores, activation sensitivity on 2 samples, same rankings to the last bit:
the PP-OCRv4 detector 12.6-16.2 s one config at a time, 8.5-9.4 s two at a time (10.3 s
with every segment session keeping both threads); the recogniser 13.2-15.9 s and
10.0-10.8 s. A segment chain run alone on one thread (a sample's float reference) is up to
1.5x slower than on two; there is one per sample. Each config in flight holds its own
tensors, so the engine's peak memory grows by about one run's buffers per extra thread
(the detector at one sample: 207 -> 233 MiB), which :data:`BUDGET_BYTES` bounds.

onnxruntime releases the GIL while it runs, and a session may be run from several threads
at once; what the engine shares between them (the sample, its float prefix, the compiled
segments) is computed or compiled before, or under a lock.
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading


# Beyond this many configs in flight, the cores go to each segment session's own threads
MAX_WORKERS = 8
# Configs in flight together may hold this many bytes of a sample's segment boundaries, a
# bound of a run's own tensors (measured on the PP-OCRv4 detector: boundaries 45 MiB, one
# more run in flight 21-30 MiB): a model with large activations runs fewer at once, down to one.
BUDGET_BYTES = 1 << 30


def default_count(providers, low_memory, cores):
    """How many configs to run at once by default: one per core this process may use, at
    most :data:`MAX_WORKERS`; but one on a GPU provider (a device runs its own kernels in
    parallel) and in low-memory mode (each run in flight holds its buffers)."""
    if low_memory or any(p != "CPUExecutionProvider" for p in providers):
        return 1
    return max(1, min(MAX_WORKERS, cores))


def affordable(count, run_bytes):
    """``count`` reduced so that that many runs of ``run_bytes`` each fit :data:`BUDGET_BYTES`."""
    return max(1, min(count, BUDGET_BYTES // max(1, int(run_bytes))))


class Workers:
    """A pool of ``count`` threads started on first use; :meth:`map` keeps the order.
    ``limit``: a callable giving how many may run at once now (at most ``count``; the cores
    this process may keep busy, which grow when the pytest-xdist workers it shares them with
    have ended; see :func:`.runtime.spare_cores`)."""

    def __init__(self, count, limit=None):
        self.count = count
        self._limit = limit
        self._pool = None
        self._gate = threading.Condition()
        self._active = 0

    def _gated(self, fn, item):
        """``fn(item)`` once fewer than ``limit()`` calls are running."""
        with self._gate:
            while self._active >= max(1, self._limit()):
                self._gate.wait(0.5)  # the limit is looked up again, not signalled
            self._active += 1
        try:
            return fn(item)
        finally:
            with self._gate:
                self._active -= 1
                self._gate.notify()

    def map(self, fn, items):
        """``fn(item)`` for each of ``items``, in order, at most ``count`` at once, and no more
        than ``2 * count`` results waiting for the caller (each holds a run's outputs). A
        caller that stops early (an error, a time budget) stops the rest: what has not started
        is cancelled, what runs is waited for, so no run outlives the loop that asked for it."""
        count = self.count
        if count <= 1:
            for item in items:
                yield fn(item)
            return
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(count, thread_name_prefix="ptq-config")
        pending = collections.deque()
        try:
            call = fn if self._limit is None else (lambda item: self._gated(fn, item))
            for item in items:
                pending.append(self._pool.submit(call, item))
                if len(pending) >= 2 * count:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for f in pending:
                f.cancel()
            concurrent.futures.wait(pending)

    def close(self):
        """Stop the threads (started again on next use)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

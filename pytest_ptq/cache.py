"""Results kept on disk between runs, keyed by everything they depend on.

A rerun of an unchanged contract reads its sensitivities, curves, verdicts and remedies
instead of computing them again. An entry's key holds the sha256 of the model, the
calibration data, the float model, the custom-op library and of any other file the result
read (held-out data), the sample limit, the request itself (node type, metric, outputs,
...), and the versions of pytest-ptq (with a digest of its own source, so an edited
checkout never reads its old results), onnx, onnxruntime, numpy and the providers
onnxruntime offers. Change any of them and the result is computed again.

An entry is one file: a header naming the format, the checksum of the payload, then the
payload: the sha256 of the key and the pickled result. It is read only when the checksum and
the key both match, so a truncated, damaged or colliding file is ignored (and rewritten by the
next computation), never trusted; and it is unpickled only into what results are made of, a
fixed list (pytest-ptq's result records, numpy arrays, paths, builtin containers) rebuilt
without calling their code: no module it names is imported and no object of another class
is built, so an entry crafted by whoever can write the folder (a shared CI cache) cannot run
code, and anything else is a stale entry, computed again. The checksum is a sha256, which
whoever writes an entry can compute too: an edited entry with its checksum redone is read.
With :data:`KEY_VARIABLE` set (a CI secret that the jobs of untrusted branches do not get),
it is an HMAC under that key instead, and an entry written without it is ignored.
Writes are atomic, so xdist workers can share the folder. A request with a part that has no
stable text (a Python callable, say) is computed, not cached.

Entries of models, data or pytest-ptq versions no longer used are never read again: the
folder keeps those read or written in the last :data:`MAX_AGE_DAYS` days, the most recently
used first, up to :data:`MAX_BYTES` (a read marks an entry used), so a cache restored from
job to job does not grow without bound.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import importlib
import io
import os
import pickle
import sys
import time
import warnings
from pathlib import Path

from . import guard
from .errors import PTQError, PTQWarning, user_level

MAGIC = b"pytest-ptq cache 2\n"
KEY_VARIABLE = "PTQ_CACHE_KEY"
SUFFIX = ".ptq-cache"
MAX_AGE_DAYS = 30
MAX_BYTES = 512 * 2**20  # the example suite's results take under 10 MiB
_PLAIN = (str, int, float, bool, type(None))


class PTQCacheWarning(PTQWarning):
    """A result could not be kept on disk: the run goes on, the next one computes it again."""


def warn_not_kept(message):
    """Warn that results are not kept between runs. Where warnings are errors it is shown all
    the same, not raised: keeping results only saves time, and a check that passed must not
    fail for it (a filter that ignores it still silences it)."""
    try:
        warnings.warn(PTQCacheWarning(message), stacklevel=user_level())
    except PTQCacheWarning:
        with warnings.catch_warnings():
            warnings.simplefilter("always", PTQCacheWarning)
            warnings.warn(PTQCacheWarning(message), stacklevel=user_level())


def file_hash(path):
    """sha256 of a file, or of a folder's files (relative names and bytes, sorted by name)."""
    path = Path(path)
    h = hashlib.sha256()
    # sorted by the names' parts, case kept: as Linux sorts paths, where Windows' paths sort
    # without case and Python 3.12's by the whole string (the same data hashed otherwise)
    files = [path] if path.is_file() else sorted(_files_below(path), key=lambda f: f.relative_to(path).parts)
    for f in files:
        if f != path:
            h.update(f.relative_to(path).as_posix().encode() + b"\0")
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def _files_below(folder):
    """The files under ``folder``, through symbolic links to folders as the data loader reads
    them (a data set kept elsewhere and linked in per input), each folder once."""
    seen = set()
    for root, dirs, names in os.walk(folder, followlinks=True):
        real = os.path.realpath(root)
        if real in seen:  # a link back up the tree: walked already
            dirs[:] = []
            continue
        seen.add(real)
        yield from (p for p in (Path(root) / n for n in names) if p.is_file())


def model_files(path):
    """A model file and the external data files it names, or ``[]`` for None."""
    return [] if path is None else [path, *guard.external_data_files(path)]


def model_hash(path, digest=file_hash):
    """sha256 of a model file and its external data files (the file's own hash when it has
    none, so that models without external data keep the hashes recorded before)."""
    own = digest(path)
    extra = guard.external_data_files(path)
    if not extra:
        return own
    h = hashlib.sha256(own.encode())
    for p in sorted(extra, key=str):
        h.update(Path(p).name.encode() + b"\0" + digest(p).encode())
    return h.hexdigest()


def arrays_digest(arrays):
    """sha256 of ``{name: array}``: names, dtypes, shapes and bytes, by name."""
    import numpy as np

    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.asarray(arrays[name], order="C")  # a scalar stays 0-d
        h.update(f"{name}\0{a.dtype.str}\0{a.shape}\0".encode())
        h.update(a.data)
    return h.hexdigest()


@functools.cache
def tool_versions():
    """``(name, version)`` pairs of what computes a result; pytest-ptq's includes a digest
    of its source files, the providers those onnxruntime offers and PTQ_PROVIDERS picks, and
    whether this CPU's integer kernels saturate (the integer stage reads otherwise: a cache
    shared between machines must not hand one CPU's kernels to another)."""
    import numpy
    import onnx
    import onnxruntime

    from . import __version__
    from .engine.runtime import integer_kernels_saturate

    package = Path(__file__).resolve().parent
    source = hashlib.sha256()
    for f in sorted(package.rglob("*.py")):
        source.update(f.relative_to(package).as_posix().encode() + b"\0" + f.read_bytes())
    return (("pytest_ptq", f"{__version__}+{source.hexdigest()[:16]}"), ("onnx", onnx.__version__),
            ("onnxruntime", onnxruntime.__version__), ("numpy", numpy.__version__),
            ("providers", tuple(onnxruntime.get_available_providers()), os.environ.get("PTQ_PROVIDERS")),
            ("uint8 x int8 kernels", "saturating" if integer_kernels_saturate() else "exact"))


def plain(value):
    """True when ``value`` is made of strings, numbers, None and tuples of them only: a key
    part whose text is the same in every run."""
    if isinstance(value, tuple):
        return all(plain(v) for v in value)
    return isinstance(value, _PLAIN)


class ResultCache:
    """The entries of one model under ``folder``: :meth:`get` a result, computing and
    storing it when absent (``option`` names the folder's setting in the one warning a failed
    write gives). ``inputs()`` returns a mapping of a role (``"model"``, ``"data"``,
    ...) to the path it names or None, asked once on first use; ``settings`` is a tuple of
    further plain key parts (the sample limit)."""

    def __init__(self, folder, inputs, settings=(), option="the cache folder", shown=str, read=dict,
                 read_only=False):
        self.folder = Path(folder)
        self.read_only = read_only  # a folder this run cannot write: its entries are read, none added
        # ``read()``: ``{real path: guard.version}`` of the inputs before they were read (see
        # Engine.versions); an input hashed, or rewritten since, otherwise keeps nothing
        self.read = read
        self._versions = {}  # real path -> its version when hashed
        self.option = option  # how the user named the folder, for the warning
        self.inputs = inputs
        self.settings = tuple(settings)
        # results name their files (a failure says "on 4 samples (calib)"), so the paths as
        # messages show them are keyed beside the bytes: moved data must not read as the old name
        self.shown = lambda p: None if p is None else str(shown(p))
        self._base = None
        self._guard = None  # guard.Inputs of the inputs, built on the first write
        self._hashes = {}
        self.hits = self.misses = 0
        self.write_error = None  # the first failed write, as one sentence (warned once)
        self._pruned = False  # the folder's unused entries removed, on the first write

    def hash_of(self, path):
        """sha256 of a file or folder (computed once per cache)."""
        key = str(path)
        if key not in self._hashes:
            self._versions[str(guard.real(path))] = guard.version(path)  # before: a rewrite while hashing shows
            self._hashes[key] = file_hash(path)
        return self._hashes[key]

    def _rewritten(self):
        """An input hashed for the keys that is not what was read, or was rewritten since
        (a model re-exported while this run reads it), or None."""
        read = self.read() or {}
        for path, hashed in self._versions.items():
            if guard.version(path) != hashed or read.get(path, hashed) != hashed:
                return path
        return None

    def base(self):
        """The key parts every entry shares: input hashes, settings and tool versions."""
        if self._base is None:
            inputs = sorted(self.inputs().items())
            self._base = (tuple((role, self.shown(p), None if p is None else self.hash_of(p)) for role, p in inputs),
                          self.settings, tool_versions())
        return self._base

    def key(self, request, files=()):
        """The full key of ``request`` (a tuple of plain parts) that also read ``files``; None
        when the request cannot be keyed (a part without stable text)."""
        if not plain(request) or any(f is not None and not isinstance(f, (str, os.PathLike)) for f in files):
            return None  # data given as arrays has no file to hash: computed, not kept
        return (self.base(), request, tuple(None if f is None else (self.shown(f), self.hash_of(f)) for f in files))

    def path(self, key):
        return self.folder / (hashlib.sha256(repr(key).encode()).hexdigest()[:40] + SUFFIX)

    def get(self, request, compute, files=()):
        """The stored result of ``request``, else ``compute()`` stored for next time."""
        key = self.key(request, files)
        if key is None:
            return compute()
        path = self.path(key)
        found, value = _read(path, key)
        if found:
            self.hits += 1
            with contextlib.suppress(OSError):  # used now: the last to go (a read-only folder keeps it all)
                os.utime(path)
            return value
        self.misses += 1
        value = compute()
        self._store(path, key, value, files)
        return value

    def _store(self, path, key, value, files):
        if self.read_only:
            return
        try:
            pickled = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # noqa: BLE001 - a result that cannot be pickled is simply not kept
            return
        try:  # read back as the next run will: an entry it refuses would be computed again on every run, unsaid
            _ResultUnpickler(io.BytesIO(pickled)).load()
        except Exception as exc:  # noqa: BLE001 - any refusal is the same defect
            if self.write_error is None:
                self.write_error = f"a result holds what the cache does not read back ({exc})"
                warn_not_kept(f"results are not kept between runs ({self.option}): {self.write_error}; they are "
                              "computed again on every run, a defect of pytest-ptq to report")
            return
        payload = _key_digest(key) + b"\n" + pickled
        rewritten = self._rewritten()
        if rewritten is not None:  # its result would be kept under the bytes of another file
            if self.write_error is None:
                self.write_error = f"{rewritten!r} changed while this run read it"
                warn_not_kept(f"results are not kept between runs ({self.option}): {self.write_error}; run again "
                              "once it is written")
            return
        if self._guard is None:
            self._guard = guard.Inputs()
            for role, p in self.inputs().items():
                self._guard.add(p, role)
        protect = guard.Inputs(self._guard.items)
        for f in files:
            protect.add(f, "input")
        try:
            # never inside what the results were computed from: the next run would read it as data
            with guard.protecting(protect):
                guard.write_bytes(path, MAGIC + _checksum(payload) + b"\n" + payload)
        except PTQError as exc:
            if self.write_error is None:
                self.write_error = str(exc)
                warn_not_kept(f"results are not kept between runs ({self.option}): {exc}")
            return
        if not self._pruned:
            self._pruned = True
            prune(self.folder)


def prune(folder, now=None):
    """Remove the entries of ``folder`` not used in :data:`MAX_AGE_DAYS` days, then the least
    recently used until the rest take at most :data:`MAX_BYTES`. Returns how many went;
    never raises (an entry another process removes first is simply gone). Half-written
    entries a killed run left go too (they were removed only when that entry was written again)."""
    now = time.time() if now is None else now
    guard.clean_stale_temps(folder)
    entries = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            if entry.name.endswith(SUFFIX) and entry.is_file(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    st = entry.stat(follow_symlinks=False)
                    entries.append((st.st_mtime, st.st_size, entry.path))
    entries.sort(reverse=True)  # the most recently used first
    kept, removed = 0, 0
    for mtime, size, path in entries:
        if now - mtime <= MAX_AGE_DAYS * 86400 and kept + size <= MAX_BYTES:
            kept += size
            continue
        with contextlib.suppress(OSError):
            os.unlink(path)
            removed += 1
    return removed


def for_engine(folder, engine, option="--cache-dir"):
    """A :class:`ResultCache` under ``folder`` for results computed on ``engine``, keyed by
    every file it reads (the model's external data too); None when its model or data came
    as objects, which have no file to hash. A folder it cannot write is read (one warning)."""
    model, data = engine.qmodel.path, getattr(engine.data, "path", None)
    if model is None or data is None:
        return None
    read_only = not writable(folder, option)

    def inputs():
        # as given: results name their files so (hashing reads through links alike)
        files = {f"{item.what} {i}": item.given for i, item in enumerate(engine.inputs().items)}
        files.update({f"model data {i}": p for i, p in enumerate(model_files(model)[1:])})
        if isinstance(engine.float_model, (str, os.PathLike)):
            files.update({f"float model data {i}": p for i, p in enumerate(model_files(engine.float_model)[1:])})
        return files

    # the engine's own options change its figures (to rounding on CPU; more on another provider)
    options = (("optimization", engine.optimization), ("providers", tuple(map(str, engine.providers))))
    return ResultCache(folder, inputs, options, option=option, read=lambda: engine.versions, read_only=read_only)


def writable(folder, option, warn=warn_not_kept, then="those kept there already are read"):
    """Whether results can be added to ``folder``; where not, one warning (``warn(text)``)
    says so and ``then`` what happens instead (by default: a cache shared read-only is read)."""
    try:
        guard.check_writable(folder, f"the result cache ({option})", folder=True)
    except PTQError as exc:
        warn(f"results are not kept between runs: {exc}; {then}")
        return False
    return True


def through(store, request, compute, files=()):
    """``store.get(request, compute, files)``, or just ``compute()`` without a store."""
    return compute() if store is None else store.get(request, compute, files)


def _checksum(payload):
    """The payload's sha256, or its HMAC-SHA256 under :data:`KEY_VARIABLE` where that is set."""
    secret = os.environ.get(KEY_VARIABLE)
    if secret:
        return hmac.new(secret.encode(), payload, hashlib.sha256).hexdigest().encode()
    return hashlib.sha256(payload).hexdigest().encode()


def _key_digest(key):
    return hashlib.sha256(repr(key).encode()).hexdigest().encode()


# Everything an entry may name, by the names pickle writes, and what reading it may do with
# each: nothing else is looked up, so reading an entry imports no module its writer chose
# (pytest_ptq.__main__ runs the command line on import) and builds no object of another class.
_KINDS = {
    # called: how numpy and a few builtins rebuild their objects, and paths (from their parts, no I/O)
    **{("builtins", n): "call" for n in ("complex", "slice", "range")}, ("collections", "OrderedDict"): "call",
    **{(m, n): "call" for m in ("numpy", "numpy.core.multiarray", "numpy._core.multiarray", "numpy.core.numeric",
                                "numpy._core.numeric")
       for n in ("dtype", "_reconstruct", "scalar", "_frombuffer")},
    # (pathlib._local: where Python 3.13 defines them, and pickles them from)
    **{(m, n): "call" for m in ("pathlib", "pathlib._local")
       for n in ("PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath")},
    # given to numpy's _reconstruct: the plain array class (a memmap's __new__ opens a file, write mode included)
    ("numpy", "ndarray"): "array",
    # the records results are made of: created by their __new__ and filled from their state, never
    # called, so no code of theirs runs. One missing here is computed again on every run instead
    # of read back
    **{(m, n): "record" for m, n in (
        ("pytest_ptq.analysis", "OutputMetrics"), ("pytest_ptq.confidence", "Confidence"),
        ("pytest_ptq.curves", "Curves"), ("pytest_ptq.datacheck", "DataReport"), ("pytest_ptq.datacheck", "Finding"),
        ("pytest_ptq.diagnosis", "Diagnosis"), ("pytest_ptq.engine.sanity", "Equivalence"),
        ("pytest_ptq.guard", "Input"), ("pytest_ptq.guard", "Inputs"),  # what a result was read from
        ("pytest_ptq.remedy.result", "Remedy"), ("pytest_ptq.screening", "Screening"),
        ("pytest_ptq.sensitivity", "Sensitivity"), ("pytest_ptq.stages", "StageReport"),
        ("pytest_ptq.verdict", "Verdict"))},
}


def _named(module, name):
    """The object of :data:`_KINDS` named ``module.name``, else None. pytest-ptq's result
    modules are imported when not yet (by a name from the list, not the entry's); numpy's are
    only looked up, loaded as they are wherever numpy wrote the entry."""
    kind = _KINDS.get((module, name))
    if kind is None:
        return None
    loaded = sys.modules.get(module)
    if loaded is None and kind == "record":
        loaded = importlib.import_module(module)
    if loaded is None and module == "pathlib._local":  # written by Python 3.13, read by an older one
        loaded = sys.modules.get("pathlib")
    with warnings.catch_warnings():  # numpy 2 keeps numpy.core, for old pickles, with a warning
        warnings.simplefilter("ignore", DeprecationWarning)
        return getattr(loaded, name, None)


class _ResultUnpickler(pickle._Unpickler):  # the Python one: its opcodes can be overridden
    """Reads what results are made of and refuses the rest: a global must be one of
    :data:`_KINDS`, and each is used only as its kind allows: the functions and paths are the
    only calls, the records the only objects created (by ``__new__``, with no arguments) and,
    with numpy's arrays and dtypes, the only ones filled from a state. No class is called
    (pickle's OBJ and INST opcodes call one with any arguments)."""

    def __init__(self, file):
        super().__init__(file)
        self._given = {}  # id -> (kind, object) of each global looked up (kept alive: ids stay theirs)

    def find_class(self, module, name):
        obj = _named(module, name)
        if obj is None:
            raise pickle.UnpicklingError(f"{module}.{name} is not part of a result")
        self._given[id(obj)] = (_KINDS[module, name], obj)
        return obj

    def _kind(self, obj):
        kind, given = self._given.get(id(obj), (None, None))
        return kind if given is obj else None

    def _reduce(self):
        args = self.stack.pop()
        func = self.stack[-1]
        if self._kind(func) != "call":
            raise pickle.UnpicklingError(f"{func!r} is not called while reading a result")
        self.stack[-1] = func(*args)

    def _newobj(self):
        args = self.stack.pop()
        cls = self.stack.pop()
        if self._kind(cls) != "record" or args:
            raise pickle.UnpicklingError(f"{cls!r} is not created while reading a result")
        self.append(cls.__new__(cls))

    def _build(self):
        inst, state = self.stack[-2], self.stack[-1]
        np = sys.modules.get("numpy")
        if not (self._kind(type(inst)) == "record"
                or np is not None and type(inst) is np.ndarray and _plain_array_state(np, state)
                or np is not None and isinstance(inst, np.dtype) and _plain_dtype_state(inst, state)):
            raise pickle.UnpicklingError(f"a {type(inst).__name__} is not filled so while reading a result")
        pickle._Unpickler.load_build(self)

    def _called(self):
        raise pickle.UnpicklingError("no class is called while reading a result")

    dispatch = {**pickle._Unpickler.dispatch, pickle.REDUCE[0]: _reduce, pickle.NEWOBJ[0]: _newobj,
                pickle.BUILD[0]: _build, pickle.OBJ[0]: _called, pickle.INST[0]: _called,
                pickle.NEWOBJ_EX[0]: _called}


def _plain_dtype_state(dtype, state):
    """Whether ``state`` fills ``dtype`` (just made from its type string) as numpy pickles
    that type: the state the type itself has (no fields, no subarray, its sizes and flags),
    its byte order alone free, and that only for numbers. What a state says is what numpy
    trusts to tell numbers from object pointers: an object field flagged as holding none, or
    objects in the other byte order, read pointers of the entry's choosing (a crash, no
    exception)."""
    own = dtype.__reduce__()[2]
    return (isinstance(state, tuple) and len(state) == len(own) and state[:1] + state[2:] == own[:1] + own[2:]
            and (state[1] == own[1] or not dtype.hasobject and state[1] in ("<", ">", "|", "=")))


def _plain_array_state(np, state):
    """Whether ``state`` fills an array without fields, whose objects (if any) come as a list
    of values, as numpy pickles them, never as bytes read as pointers."""
    return (isinstance(state, tuple) and len(state) == 5 and isinstance(state[2], np.dtype)
            and state[2].names is None and (not state[2].hasobject or isinstance(state[4], list)))


def _read(path, key):
    """``(True, result)`` from a sound entry of ``key`` at ``path``, else ``(False, None)``."""
    try:
        with open(path, "rb") as fh:
            blob = fh.read()
    except OSError:
        return False, None
    head, _, rest = blob[len(MAGIC):].partition(b"\n")
    if not blob.startswith(MAGIC) or not hmac.compare_digest(_checksum(rest), head):
        return False, None
    stored_key, _, payload = rest.partition(b"\n")
    if stored_key != _key_digest(key):
        return False, None
    try:
        return True, _ResultUnpickler(io.BytesIO(payload)).load()
    except KeyboardInterrupt:
        raise
    except BaseException:  # noqa: BLE001 - a class renamed since, or not a result (even one that exits): stale
        return False, None


def clear(folder):
    """Remove the cache entries (and stale temporary files) in ``folder``; other files stay.
    Returns how many entries were removed."""
    removed = 0
    try:
        names = os.listdir(folder)
    except OSError:
        return 0
    for name in names:
        if name.endswith(SUFFIX):
            try:
                os.unlink(os.path.join(folder, name))
                removed += 1
            except OSError:  # gone already, or not ours to remove: clearing the rest is what counts
                pass
    guard.clean_stale_temps(folder)
    return removed

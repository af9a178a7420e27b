"""Outputs never land on inputs, and a failed write is one sentence.

Each face declares what a run reads as :class:`Inputs` (the model and its external data
files, the float model, calibration and held-out data, evaluation files, contracts) and
checks every output path it was given with :func:`output_path` before any work: writing
onto an input, or inside a data folder, is refused. Files written under an output folder
are only named when written, so every write goes through :func:`write_text` or
:func:`writing`, which check the path again against the inputs in force
(:func:`protecting`) and turn an ``OSError`` into a :class:`~pytest_ptq.errors.PTQError`
naming the path and what to do.

Paths are compared by what they are on disk, not by their spelling: resolved real paths
for containment, and device and inode numbers for files, so symlinks, hard links, ``..``
and the case of names on case-insensitive file systems do not slip through.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import errno
import os
import re
import stat
import sys
import threading
import time
from pathlib import Path

from . import onnxfile
from .errors import PTQError
from .errors import shown as _shown

# A temporary file of an atomic write older than this is stale whoever wrote it: a write
# takes milliseconds, and a process on another machine sharing the folder cannot be asked.
STALE_AFTER_S = 3600.0
# ... and one whose writer is gone (same machine) is stale after this grace period.
DEAD_GRACE_S = 60.0


def shown(value):
    # paths are the point of these messages: cut only what no one could read anyway
    return _shown(value, 240)


# The roles (Inputs.add's ``what``) of the inputs that are models: onnx reads a model of any
# name, so its external data files are inputs whatever the model file is called. Callers name
# a model by these constants, never by words of their own, which would read as some other input
# (no external data protected, none hashed); a new kind of model read gets its constant here.
MODEL_FILE = "model file"
FLOAT_MODEL = "float model"
MODEL_ROLES = (MODEL_FILE, FLOAT_MODEL)

_PROTECTED = contextvars.ContextVar("pytest_ptq_protected_inputs", default=None)


@dataclasses.dataclass(frozen=True)
class Input:
    """One thing a run reads: ``folder`` inputs (data folders) protect everything inside."""

    given: str  # as the user spelled it, for messages
    real: Path
    what: str  # "model file", "calibration data", ...
    folder: bool
    model: bool = False  # a model (by its role, whatever its name): its external data files are inputs too


class Inputs:
    """What a run reads; :meth:`check` refuses an output that would land on any of it."""

    def __init__(self, items=()):
        self.items = list(items)
        self._files = None  # {(st_dev, st_ino): (Input, file)} of every input file, built on demand
        self._external = {}  # model path -> its external data files, read on demand

    def add(self, path, what):
        """Add ``path`` (a file or folder; None, a ModelProto or a mapping is ignored) read as
        ``what``; a model is added as one of :data:`MODEL_ROLES`."""
        if path is None or not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
            return self
        given = os.fsdecode(os.fspath(path))
        resolved = real(given)
        folder = _isdir(resolved)
        model = not folder and (what in MODEL_ROLES or resolved.suffix.lower() == ".onnx")
        self.items.append(Input(given, resolved, what, folder, model=model))
        if folder:
            # a data folder's sub-folders may be symlinks into other trees: protect those too
            try:
                for child in os.scandir(resolved):
                    if child.is_symlink() and child.is_dir():
                        self.items.append(Input(os.path.join(given, child.name), real(child.path), what, True))
            except OSError:  # an unreadable folder: loading its data will say so in its own words
                pass
        self._files = None
        return self

    def __or__(self, other):
        return Inputs(self.items + (list(other.items) if other is not None else []))

    def __bool__(self):
        return bool(self.items)

    def check(self, path, label):
        """Raise PTQError when writing ``path`` (a file or a folder) would write onto an input
        or inside a data folder; ``label`` names the option. Returns the resolved path."""
        target = real(path)
        where = f"{label} {shown(os.fspath(path))}"
        for item in self.items:
            if not item.folder:
                continue
            if _same(target, item.real):
                raise PTQError(f"{where} is the {item.what} folder {shown(item.given)}; pytest-ptq never "
                               "writes onto an input, so choose a path outside it")
            if _inside(target, item.real):
                raise PTQError(f"{where} lies inside the {item.what} folder {shown(item.given)}; the next run "
                               "would read what is written there as data, so choose a path outside it")
        key = _key(target)
        if key is None:  # nothing there yet, so it is no input file
            return target
        hit = self._file_index().get(key)
        if hit is not None:
            item, file = hit
            what = (f"the {item.what} file {shown(file)} (in {shown(item.given)})" if item.folder
                    else f"the {item.what} {shown(item.given)}")
            raise PTQError(f"{where} is {what}; writing it would destroy an input, so choose another path")
        for item in self.items:
            # external data lies beside its model: read the model's tensor list only then
            if item.model and _inside(target, item.real.parent):
                for file in self._externals(item):
                    if _key(file) == key:
                        raise PTQError(f"{where} is the external data file {shown(file.name)} of the {item.what} "
                                       f"{shown(item.given)}; writing it would destroy an input, so choose "
                                       "another path")
        return target

    def _file_index(self):
        if self._files is None:
            files = {}
            for item in self.items:
                for f in _walk(item.real) if item.folder else [item.real]:
                    key = _key(f)
                    if key is not None:
                        files.setdefault(key, (item, f))
            self._files = files
        return self._files

    def _externals(self, item):
        if item.real not in self._external:
            self._external[item.real] = external_data_files(item.real)
        return self._external[item.real]


def external_data_files(model_path):
    """The external data files a model file names (resolved); none when it cannot be read.
    One outside the model's folder, or not a regular file, is refused (see
    :func:`external_data_file`): the result cache hashes what this returns."""
    if not Path(model_path).is_file():  # a pipe would block, a device never end: the loader says so
        return []
    try:
        # walked, not parsed: the plugin and the CLI ask this of every model once a run, and a
        # parse held the model's inline weights twice over for a list they are no part of
        found = onnxfile.external_locations(model_path)
    except Exception:  # an unreadable model is reported by the loader, not here
        return []
    out = [external_data_file(Path(model_path).parent, location, f"{kind} {name!r} of {shown(str(model_path))}")
           for kind, name, location in found]
    return list(dict.fromkeys(out))


def external_data_file(folder, location, what):
    """The real path of ``location``, where ``what`` (``"initializer 'w' of 'm.onnx'"``) keeps
    its external data, named from the model's ``folder``. One whose real path lies outside that
    folder is refused before anything opens or hashes it, as onnx and onnxruntime refuse it: a
    downloaded model must not make a run read any file it names (a location of ../../../usr had
    the result cache hash all of /usr); then one that is not a regular file (a pipe blocks, a
    device never ends)."""
    if "\0" in location:  # no path holds one (realpath raised ValueError)
        raise PTQError(f"{what} keeps its data in {shown(location)}, a name holding a NUL character, which names no "
                       "file; re-export the model with its external data beside it")
    # no ~ expanded: onnx reads the location as written, from the folder
    path, base = (Path(os.path.realpath(p)) for p in (os.path.join(folder or ".", location), folder or "."))
    if not path.is_relative_to(base):
        raise PTQError(f"{what} keeps its data in {shown(location)}, which resolves to {shown(str(path))}, outside "
                       f"the model's folder {shown(str(base))}; onnx and onnxruntime refuse such a model: keep the "
                       "external data file in the model's folder")
    try:
        irregular = path.exists() and not path.is_file()
    except OSError as exc:  # a name too long for the file system, say
        raise PTQError(f"{what} keeps its data in {shown(location)}, which names no readable file "
                       f"({exc.strerror or exc}); re-export the model with its external data beside it") from None
    if irregular:
        raise PTQError(f"{what} keeps its data in {shown(location)}, which is not a regular file; keep the external "
                       "data file beside the model")
    return path


def version(path):
    """What ``path`` is on disk now, to tell a rewrite: ``(size, mtime_ns, inode)`` of a file,
    those of each file below a folder (by relative name), or None where it cannot be read."""
    path = Path(os.path.expanduser(os.fspath(path)))  # as the loaders read "~/data"
    st = _stat(path)
    if st is None:
        return None
    if not stat.S_ISDIR(st.st_mode):
        return st.st_size, st.st_mtime_ns, st.st_ino
    out = []
    for f in sorted(_walk(path)):
        fs = _stat(f)
        out.append((f.relative_to(path).as_posix(), None if fs is None else (fs.st_size, fs.st_mtime_ns, fs.st_ino)))
    return tuple(out)


def versions(*given):
    """``{real path: version}`` of the paths among ``given`` (objects are skipped)."""
    return {str(real(g)): version(g) for g in given if isinstance(g, (str, os.PathLike))}


def real(path):
    try:
        return Path(os.path.realpath(os.path.expanduser(os.fspath(path))))
    except (OSError, ValueError):
        return Path(os.path.abspath(os.fspath(path)))


def _stat(path):
    try:
        return os.stat(path)
    except (OSError, ValueError):
        return None


def _key(path):
    st = _stat(path)
    return (st.st_dev, st.st_ino) if st is not None else None


def _isdir(path):
    st = _stat(path)
    return st is not None and stat.S_ISDIR(st.st_mode)


def _same(a, b):
    if a == b:
        return True
    ka, kb = _key(a), _key(b)
    return ka is not None and ka == kb


def _inside(target, folder):
    """True when ``target`` lies below ``folder``, by name or by the identity of an ancestor
    (a case-insensitive file system spells one folder several ways)."""
    if target.is_relative_to(folder):
        return True
    folder_key = _key(folder)
    if folder_key is None:
        return False
    for parent in target.parents:
        if _key(parent) == folder_key:
            return True
    return False


def _walk(folder):
    out = []
    for root, _dirs, files in os.walk(folder, followlinks=True):
        out.extend(Path(root) / f for f in files)
    return out


# -- checking an output before any work ------------------------------------------------------
def output_path(value, label, inputs=None, folder=False, atomic=False, writable=True):
    """``value`` as the Path of an output, checked before any work: a path (str or PathLike),
    not an input nor inside a data folder, of the right kind (file or folder), and (unless
    ``writable`` is false: it may only be read this time) writable as far as can be told
    without writing. ``label`` names the option in messages."""
    if isinstance(value, bool) or not isinstance(value, (str, os.PathLike)):
        raise PTQError(f"{label} must be a path, got {shown(value)}")
    text = os.fspath(value)
    if not isinstance(text, str) or not text.strip():
        raise PTQError(f"{label} must be a path, got {shown(value)}")
    if "\0" in text:
        raise PTQError(f"{label} {shown(text)} holds a NUL character; give a plain path")
    path = Path(os.path.expanduser(text))
    if inputs:
        inputs.check(path, label)
    check_writable(path, label, folder=folder, atomic=atomic, access=writable)
    return path


def check_writable(path, label, folder=False, atomic=False, access=True):
    """Raise PTQError when ``path`` cannot be written: the wrong kind of thing is there, a
    parent is a file, or (with ``access``) the folder it goes in is read-only. ``atomic``
    writes replace the file, so they need its folder writable and a regular file there."""
    path = Path(path)
    where = f"{label} {shown(str(path))}"
    st = _stat_missing_ok(path)
    if st is not None:
        is_dir = stat.S_ISDIR(st.st_mode)
        if folder and not is_dir:
            raise PTQError(f"{where} is a file; give a folder")
        if not folder and is_dir:
            raise PTQError(f"{where} is a folder; give a file name")
        if folder:
            if access and not os.access(path, os.W_OK | os.X_OK):
                raise PTQError(f"{where} is a read-only folder; choose a writable folder or fix its permissions")
            return
        if not atomic:
            if access and not os.access(path, os.W_OK):
                raise PTQError(f"{where} is read-only; choose another path or fix its permissions")
            return
        if not stat.S_ISREG(st.st_mode):
            raise PTQError(f"{where} is not a regular file; give the path of a file")
        if access and not os.access(path, os.W_OK):  # replacing it would bypass what its mode says
            raise PTQError(f"{where} is read-only; choose another path or fix its permissions")
    found = _existing_ancestor(path if folder else path.parent)
    if found is None:
        return
    anc, anc_st = found
    if not stat.S_ISDIR(anc_st.st_mode):
        raise PTQError(f"{where} cannot be written because {shown(str(anc))} is a file, not a folder; "
                       "remove that file or choose another path")
    if access and not os.access(anc, os.W_OK | os.X_OK):
        raise PTQError(f"{where} cannot be written because the folder {shown(str(anc))} is read-only; "
                       "choose a writable location or fix its permissions")


def _stat_missing_ok(path):
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return None
    except OSError as exc:
        raise write_error(path, exc) from None


def _existing_ancestor(path):
    """The nearest existing ``path`` or ancestor and its stat (a file there stops the walk)."""
    p = Path(path)  # as spelled, so that messages name what the user wrote
    for candidate in (p, *p.parents, Path(os.path.abspath(path)).parent):
        try:
            return candidate, os.stat(candidate)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError:
            return None
    return None


# -- writing ---------------------------------------------------------------------------------
@contextlib.contextmanager
def protecting(inputs):
    """Within the block every write checks its path against ``inputs`` too (added to those
    already protected)."""
    current = _PROTECTED.get()
    token = _PROTECTED.set(inputs | current if inputs is not None else current)
    try:
        yield
    finally:
        _PROTECTED.reset(token)


def claim(path, label="output file", folder=False):
    """Refuse ``path`` when it is a protected input or lies in a protected data folder, or
    is a file's path that is a symbolic link: writing there would write where it points (a
    link committed in a pull request, pointing outside the project). A folder may be a link
    (an output folder on another disk)."""
    inputs = _PROTECTED.get()
    if inputs:
        inputs.check(path, label)
    if not folder:
        refuse_link(path, label)
    return Path(path)


def refuse_link(path, label="output file"):
    """Raise PTQError when ``path`` is a symbolic link (dangling or not): a file the tool
    writes, or a folder it makes for itself inside the one it was given."""
    if os.path.islink(path):
        raise PTQError(f"{label} {shown(str(path))} is a symbolic link (to {shown(os.readlink(path))}); pytest-ptq "
                       "writes no file through a link: remove the link or give another path")


def write_error(path, exc):
    """The one-sentence PTQError for ``exc`` (an OSError) writing ``path``."""
    where = f"cannot write {shown(str(path))}"
    code = getattr(exc, "errno", None)
    if code in (errno.EACCES, errno.EPERM):
        held = " or close the program that has it open" if sys.platform == "win32" else ""
        return PTQError(f"{where}: permission denied; choose a writable location{held} or fix its permissions")
    if code == errno.EROFS:
        return PTQError(f"{where}: the file system is read-only; choose another location")
    if code in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
        return PTQError(f"{where}: no space left on the device; free some space or choose another location")
    if code == errno.ENAMETOOLONG:
        return PTQError(f"{where}: the name is too long; choose a shorter path")
    if code == errno.EISDIR:
        return PTQError(f"{where}: it is a folder; give a file name")
    if code in (errno.ENOTDIR, errno.EEXIST):
        dangling = next((p for p in (Path(path), *Path(path).parents) if p.is_symlink() and not p.exists()), None)
        if dangling is not None:
            return PTQError(f"{where}: {shown(str(dangling))} is a link to {shown(os.readlink(dangling))}, which does "
                            "not exist; create the link's target or choose another path")
        found = _existing_ancestor(Path(path))  # the path itself when a folder was wanted there
        blocker = f"{shown(str(found[0]))} is a file, not a folder" if found else "a parent is a file"
        return PTQError(f"{where}: {blocker}; remove that file or choose another path")
    if code == errno.ENOENT:
        return PTQError(f"{where}: its folder disappeared during the run; create it or choose another path")
    reason = getattr(exc, "strerror", None) or type(exc).__name__
    return PTQError(f"{where} ({reason}); check the location and try again")


def makedirs(path):
    """Create folder ``path`` and its parents; a failure is one sentence."""
    claim(path, "output folder", folder=True)
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise write_error(path, exc) from None
    return Path(path)


def output_folder(save_dir, prefix):
    """``(folder, temporary)``: ``save_dir``, created, and None; or, when ``save_dir`` is None,
    a new temporary folder and its ``TemporaryDirectory``, which the caller cleans up."""
    if save_dir is not None:
        return makedirs(save_dir), None
    import tempfile

    try:
        # named with this process's id, so that a later run removes what a killed one left
        _sweep_dead_folders(Path(tempfile.gettempdir()), prefix)
        temporary = tempfile.TemporaryDirectory(prefix=f"{prefix}{os.getpid()}_")
    except OSError as exc:  # FileNotFoundError: "No usable temporary directory found in [...]"
        raise PTQError(f"no temporary folder can be written ({exc.strerror or exc}); set TMPDIR to a writable "
                       "folder") from None
    return Path(temporary.name), temporary


@contextlib.contextmanager
def scratch(prefix):
    """A temporary folder for the block (a Path), removed after it; named with this process's
    id, so that one a killed run left is removed by a later run (see :func:`output_folder`)."""
    folder, temporary = output_folder(None, prefix)
    with temporary:
        yield folder


def _sweep_dead_folders(folder, prefix):
    """Remove the temporary folders ``prefix<pid>_*`` in ``folder`` whose process is gone (a
    run killed before it cleaned up: a re-quantized model each); never raises."""
    import shutil

    pattern = re.compile(re.escape(prefix) + r"(\d+)_")
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            m = pattern.match(entry.name)
            if not m or int(m.group(1)) == os.getpid() or alive(int(m.group(1))):
                continue
            with contextlib.suppress(OSError):
                if entry.is_dir(follow_symlinks=False) and time.time() - entry.stat().st_mtime > DEAD_GRACE_S:
                    shutil.rmtree(entry.path)


_WRITTEN = contextvars.ContextVar("pytest_ptq_written", default=None)


@contextlib.contextmanager
def one_command():
    """Within the block, no file is written twice: two outputs of one command under one name
    (``--json`` given a figure's name) left the second where the first was promised, and
    printed "wrote" for both."""
    token = _WRITTEN.set(set())
    try:
        yield
    finally:
        _WRITTEN.reset(token)


def _once(path, again=False):
    """Claim ``path`` for this command's one write (see :func:`one_command`); ``again``:
    the command replaces what it wrote there itself (a summary first marked unfinished)."""
    written = _WRITTEN.get()
    if written is None:
        return
    key = os.path.normcase(os.path.abspath(path))
    if key in written and not again:
        raise PTQError(f"{shown(str(path))} is written twice by this command, as two of its outputs; give the "
                       "one you named (--json, -s) another name")
    written.add(key)


@contextlib.contextmanager
def writing(path):
    """Around code that writes the file ``path`` (matplotlib, onnxruntime): the path is
    claimed, its folder created, and an OSError becomes one sentence naming it."""
    path = claim(path)
    _once(path)
    makedirs(path.parent)
    try:
        yield path
    except OSError as exc:
        raise write_error(path, exc) from None


def write_text(path, text, atomic=False, again=False, exclusive=False):
    """Write ``text`` (UTF-8) to ``path``; with ``atomic`` a reader never sees half a file
    (written beside it, then renamed); ``again``: replacing what this command wrote there
    (see :func:`one_command`); ``exclusive`` (atomic): only where no file is there yet, else
    FileExistsError, whoever made it in the meantime (another xdist worker). Returns the Path."""
    return _write(path, text, atomic, again, exclusive)


def write_bytes(path, data):
    """Write ``data`` to ``path`` atomically (see :func:`write_text`). Returns the Path."""
    return _write(path, data, atomic=True)


def _write(path, content, atomic, again=False, exclusive=False):
    path = claim(path)
    _once(path, again)
    makedirs(path.parent)

    def put(target):
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            # surrogateescape: a name that came in undecoded (a C locale) goes out as its own bytes
            target.write_text(content, encoding="utf-8", errors="surrogateescape")

    st = _stat_missing_ok(path) if atomic else None
    # a file with other names (hard links), or in a folder no file may be added to, is written
    # where it is: a rename would part it from its other names, or fail
    if not atomic or (st is not None and not exclusive and (st.st_nlink > 1 or not os.access(path.parent, os.W_OK))):
        try:
            put(path)
        except OSError as exc:
            raise write_error(path, exc) from None
        return path
    clean_stale_temps(path.parent, path.name)
    if st is not None and not os.access(path, os.W_OK):
        # a rename would replace it all the same: a file made read-only is one not to change
        raise PTQError(f"{shown(str(path))} is read-only; make it writable or choose another path")
    # a per-process name: xdist workers never share a temporary file
    tmp = temp_name(path)
    try:
        put(tmp)
        if st is not None:
            os.chmod(tmp, stat.S_IMODE(st.st_mode))  # the file keeps the permissions it had
        if exclusive:
            _link_new(tmp, path)
        else:
            try:
                replace(tmp, path)
            except OSError as exc:
                if st is None or exc.errno not in (errno.EBUSY, errno.EXDEV):
                    raise
                put(path)  # a file mounted on its own (a container's bind mount) cannot be replaced
                tmp.unlink()
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(exc, FileExistsError) and exclusive:
            raise
        if isinstance(exc, OSError):
            raise write_error(path, exc) from None
        raise
    return path


def _link_new(tmp, path):
    """Put ``tmp`` at ``path`` where no file is there, else FileExistsError: a rename would
    replace a file made since the caller looked, a hard link fails instead. On a file system
    without hard links (FAT, some network shares) a look then a rename, which two processes
    can still both pass."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError:
        if os.path.lexists(path):
            raise FileExistsError(errno.EEXIST, "exists", str(path)) from None
        replace(tmp, path)
        return
    tmp.unlink()


def replace(tmp, path, tries=8):
    """``os.replace``, retried on Windows for about a second: there a file another process
    has open (a reader, a virus scanner, the indexer) cannot be replaced, and is free again
    moments later; elsewhere a rename never waits for readers."""
    for attempt in range(tries):
        try:
            return os.replace(tmp, path)
        except PermissionError:
            if sys.platform != "win32" or attempt == tries - 1:
                raise
            time.sleep(0.01 * 2 ** attempt)


def temp_name(path):
    """The temporary file of an atomic write of ``path`` by this process and thread (two
    threads of one process writing one cache entry shared a name, and one write failed)."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}-{threading.get_native_id()}.tmp")


_TEMP = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)(?:-\d+)?\.tmp$")


def clean_stale_temps(folder, name=None):
    """Remove the temporary files that killed atomic writes left in ``folder`` (of ``name``
    only, when given): those older than :data:`STALE_AFTER_S`, or whose process is gone and
    that are older than :data:`DEAD_GRACE_S`. Returns the paths removed; never raises."""
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    now = time.time()
    for entry in entries:
        m = _TEMP.match(entry.name)
        if not m or (name is not None and m.group("name") != name):
            continue
        try:
            if not entry.is_file(follow_symlinks=False):
                continue
            age = now - entry.stat(follow_symlinks=False).st_mtime
            pid = int(m.group("pid"))
            if pid == os.getpid() or age < DEAD_GRACE_S:
                continue
            if age > STALE_AFTER_S or not alive(pid):
                os.unlink(entry.path)
                removed.append(Path(entry.path))
        except (OSError, ValueError):
            continue
    return removed


def alive(pid):
    """Whether process ``pid`` runs on this machine (a zombie, dead but not yet reaped by its
    parent, does not)."""
    if sys.platform == "win32":
        return _alive_on_windows(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OverflowError:
        return False  # no process can have that number
    except OSError:
        return True  # someone else's process: keep its file
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:  # Linux: the state follows the command's ")"
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def _alive_on_windows(pid):
    """:func:`alive` where ``os.kill(pid, 0)`` sends a Ctrl+C to a console process group
    instead of asking whether the process exists: ask Windows for its exit code."""
    import ctypes

    kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
    kernel32.OpenProcess.restype = ctypes.c_void_p
    query_limited_information, still_active, invalid_parameter = 0x1000, 259, 87
    if not 0 < pid < 2 ** 32:
        return False
    handle = kernel32.OpenProcess(query_limited_information, False, pid)
    if not handle:
        # no such process; any other refusal (access denied) is someone else's live one
        return ctypes.get_last_error() != invalid_parameter
    try:
        code = ctypes.c_ulong()
        if not kernel32.GetExitCodeProcess(ctypes.c_void_p(handle), ctypes.byref(code)):
            return True
        return code.value == still_active
    finally:
        kernel32.CloseHandle(ctypes.c_void_p(handle))

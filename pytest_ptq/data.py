"""Calibration data: the seed's folder layout, stacked arrays, or an in-memory mapping.

Samples load lazily, one at a time, so memory stays bounded by one sample whatever the
number of samples.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import os
import re
import warnings
import zipfile
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import onnx

from . import params
from .errors import NonFinite, PTQError, PTQWarning, shown, user_level
from .model.graph import declared_dims

NP_OF_ONNX = {
    onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.FLOAT16: np.float16,
    onnx.TensorProto.DOUBLE: np.float64, onnx.TensorProto.INT64: np.int64,
    onnx.TensorProto.INT32: np.int32, onnx.TensorProto.INT8: np.int8,
    onnx.TensorProto.UINT8: np.uint8, onnx.TensorProto.BOOL: np.bool_,
}


class PTQDataWarning(PTQWarning):
    """Data that do not hold what was asked of them, though the run can go on."""


def _sample_numbers(files):
    """``[number or None]`` of each file name (``7.npy``, ``img_007.npy`` -> 7): the first run
    of digits, or where every name has as many runs, the first run that tells the files
    apart (``cam1_0.npy``, ``cam1_1.npy``: 0, 1; ``2024_cam1_frame7.npy``: 7)."""
    runs = [_digit_runs(f) for f in files]
    at = _telling_run(runs)
    return [int(r[at]) if r else None for r in runs]


def _digit_runs(path):
    return re.findall(r"\d+", path.stem)


def _telling_run(runs):
    """Which run of digits numbers the names whose runs are ``runs`` (see :func:`_sample_numbers`)."""
    if len(runs) > 1 and runs[0] and all(len(r) == len(runs[0]) for r in runs):
        return next((k for k in range(len(runs[0])) if len({int(r[k]) for r in runs}) == len(runs)), 0)
    return 0


class _Source:
    """The samples of one input: files, or rows of a stacked array, or a list."""

    def __init__(self, where, items, role):
        self.where = where  # for messages
        self.items = items
        self.role = role

    def __len__(self):
        return len(self.items)

    def describe(self, i):
        item = self.items[i]
        return str(item[0]) if isinstance(item, tuple) else str(item) if isinstance(item, Path) else f"{self.where}[{i}]"

    def header(self, i):
        """(shape, dtype) of sample i without reading its values where possible."""
        item = self.items[i]
        if isinstance(item, Path):
            arr = _read_npy(item, self.role, mmap_mode="r")
            return arr.shape, arr.dtype
        arr = np.asarray(item[1][item[2]] if isinstance(item, tuple) else item)  # a view: nothing copied
        return arr.shape, arr.dtype

    def load(self, i):
        """Sample ``i`` as an array of its own: a row of a stacked array or the caller's array
        copied, so that an evaluation function preprocessing its feeds in place (``x -= mean``)
        changes neither the next pass's samples nor the caller's arrays."""
        item = self.items[i]
        if isinstance(item, Path):
            return _read_npy(item, self.role)
        if isinstance(item, tuple):  # (file, stacked array, row)
            return np.array(item[1][item[2]])
        return np.array(item)


class CalibrationData:
    """Samples for every model input, validated against the model.

    ``sample(i)`` returns ``{input name: array}`` with the batch dimension the model expects.
    """

    def __init__(self, sources, where, path=None, role="calibration"):
        self.sources = sources
        self.where = where
        self.path = path  # the file or folder read, None for a mapping
        self.role = role  # "calibration" or "held-out": what messages call this data
        counts = {k: len(v) for k, v in sources.items()}
        if len(set(counts.values())) > 1:
            raise PTQError(f"{role} data {where!r} has different sample counts per input "
                           f"({counts}); give every input the same number of samples")
        self.count = next(iter(counts.values())) if counts else 0
        if self.count == 0:
            raise PTQError(f"{role} data {where!r} holds no samples; add at least one .npy per input")
        self.indices = list(range(self.count))

    def __len__(self):
        return len(self.indices)

    @property
    def names(self):
        return list(self.sources)

    def limit(self, data_num):
        """The first ``data_num`` samples (deterministic) as a new view on the same files;
        None keeps all. The data itself is never changed, so an engine's data stays whole."""
        data_num = params.data_num(data_num)
        if data_num is None:
            return self
        view = copy.copy(self)
        view.indices = self.indices[:data_num]
        return view

    def first(self, data_num):
        """:meth:`limit` for a number a user asked for: a :class:`PTQDataWarning` where the
        data hold fewer samples (the figures say how many they are on, this says why)."""
        asked = params.data_num(data_num)
        if asked is not None and asked > len(self):
            # an Engine's own data_num may have kept fewer than the files hold: say which
            holds = (f"{self.where!r} holds {len(self)}" if len(self) == self.count else
                     f"{len(self)} of the {self.count} in {self.where!r} were kept (an earlier data_num)")
            warnings.warn(PTQDataWarning(f"{asked} {self.role} samples were asked for, but {holds}; all {len(self)} "
                                         "are used"), stacklevel=user_level())
        return self.limit(asked)

    def subset(self, positions):
        """The samples at ``positions`` (0-based, in this view, in the order given) as a new
        view on the same files: a part of the data that another part must not see."""
        view = copy.copy(self)
        view.indices = [self.indices[p] for p in positions]
        return view

    def validate(self, qmodel):
        """Check input names, ranks, static dims and dtypes against the model (headers only)."""
        expected = qmodel.input_names
        missing = [n for n in expected if n not in self.sources]
        extra = [n for n in self.sources if n not in expected]
        if missing:
            hint = f" (it has {extra})" if extra else ""
            raise PTQError(f"{self.role} data {self.where!r} has no samples for model input "
                           f"{missing[0]!r}{hint}; {self._how_to_add(missing[0])}")
        if extra and extra[0] in qmodel.inits:
            raise PTQError(f"{self.role} data {self.where!r} has samples for {extra[0]!r}, an input of "
                           f"{qmodel.source!r} with a stored value (an initializer), which every analysis keeps as "
                           "calibrated; remove it from the data")
        if extra:
            raise PTQError(f"{self.role} data {self.where!r} has samples for {extra[0]!r}, which is not "
                           f"an input of {qmodel.source!r} (inputs: {expected}); rename or remove it")
        self.expected = {}
        # an input may hold no values (a decoder's empty past); a sample of nothing at all
        # calibrates nothing, and every metric on it would read perfect
        empty = set(self.indices)
        for name in expected:
            tt = qmodel.inputs[name].type.tensor_type
            dims = declared_dims(qmodel.inputs[name])  # None: no shape declared, any rank
            dtype = NP_OF_ONNX.get(tt.elem_type)
            self.expected[name] = (dims, dtype)
            src = self.sources[name]
            for i in self.indices:
                shape, dt = src.header(i)
                _check_shape(name, src.describe(i), shape, dt, dims, dtype, self.role)
                if 0 not in tuple(shape):
                    empty.discard(i)
        if empty:
            first = self.indices.index(min(empty, key=self.indices.index))
            raise PTQError(f"{self.role} sample {self.describe(first)!r} holds no values (every input has a dimension "
                           f"of size 0{f'; {len(empty)} such samples' if len(empty) > 1 else ''}); drop it, or save "
                           "the preprocessed arrays the model takes")
        return self

    def _how_to_add(self, name):
        """What to do for input ``name``, in this data's layout."""
        if self.path is None:
            return f"add a key {name!r} to the mapping"
        if self.path.is_file():
            return f"add an array {name!r} (samples along its first axis) to the archive"
        return f"add a folder {name!r} with one .npy per sample"

    def describe(self, i):
        """Where the ``i``-th selected sample comes from: its files (or array rows), one per input."""
        return ", ".join(src.describe(self.indices[i]) for src in self.sources.values())

    def sample(self, i):
        """The ``i``-th selected sample, as float arrays shaped for the model."""
        idx = self.indices[i]
        out = {}
        for name, src in self.sources.items():
            arr = src.load(idx)
            dims, dtype = getattr(self, "expected", {}).get(name, (None, None))
            if dims is not None and arr.ndim == len(dims) - 1:
                arr = arr[None]
            if extended_float(arr.dtype):
                arr = arr.astype(np.float32)
            if dtype is not None and arr.dtype != dtype:
                # astype would wrap integers around, or make floats beyond a narrower float's range
                # infinite, silently: the model would read other values
                if arr.size and arr.dtype.kind in "iuf" and arr.dtype.kind == np.dtype(dtype).kind:
                    info = type_info(dtype)
                    finite = arr[np.isfinite(arr)] if arr.dtype.kind == "f" else arr  # NaN/Inf: refused below
                    low, high = (finite.min(), finite.max()) if finite.size else (0, 0)
                    if low < info.min or high > info.max:
                        span = "{:g}..{:g}" if arr.dtype.kind == "f" else "{}..{}"
                        raise PTQError(f"{self.role} sample {src.describe(idx)!r} for input {name!r} holds values "
                                       f"{span.format(low, high)} ({arr.dtype}), beyond the {np.dtype(dtype)} the "
                                       f"model takes ({span.format(info.min, info.max)}); check the preprocessing")
                with np.errstate(over="ignore", invalid="ignore"):
                    arr = arr.astype(dtype)
            if arr.dtype.kind == "f" and not np.isfinite(arr).all():
                bad = int((~np.isfinite(arr)).sum())
                raise PTQError(f"{self.role} sample {src.describe(idx)!r} for input {name!r} holds "
                               f"{bad} NaN/Inf values; fix the preprocessing or drop the sample")
            out[name] = np.asarray(arr, order="C")  # a scalar input stays 0-d
        return out

    def __iter__(self):
        for i in range(len(self)):
            yield self.sample(i)

    def shapes(self, i):
        """``((input, shape), ...)`` of the ``i``-th selected sample as stored, without reading
        its values where possible."""
        return tuple((name, tuple(src.header(self.indices[i])[0])) for name, src in self.sources.items())

    def fed_shapes(self, i):
        """:meth:`shapes` as the model takes them: a batch axis added where :meth:`sample`
        adds it, so a file saved without one reads as its siblings saved with one."""
        out = []
        for name, shape in self.shapes(i):
            dims = getattr(self, "expected", {}).get(name, (None, None))[0]
            out.append((name, (1, *shape) if dims is not None and len(shape) == len(dims) - 1 else shape))
        return tuple(out)


def _check_shape(name, where, shape, dt, dims, dtype, role):
    if extended_float(dt):
        dt = np.float32  # as Data.sample reads it
    elif np.dtype(dt).type is np.void and np.dtype(dt).names is None:
        raise PTQError(f"{role} sample {where!r} for input {name!r} holds raw {np.dtype(dt).itemsize}-byte values "
                       f"({np.dtype(dt).str}), not numbers, as a bfloat16 or float8 array saved with np.save reads "
                       "back; save it as float32 (astype(np.float32)) instead")
    if np.dtype(dt).kind not in "biuf":  # text, objects, records, complex: no model input takes them
        raise PTQError(f"{role} sample {where!r} for input {name!r} holds {np.dtype(dt)} values, not numbers; "
                       "save the preprocessed numeric array the model takes")
    if dims is None:
        return
    if len(shape) == len(dims) - 1:  # a sample saved without its batch dim
        shape = (1, *shape)
    if len(shape) != len(dims):
        raise PTQError(f"{role} sample {where!r} for input {name!r} has shape {tuple(shape)} but "
                       f"the model expects rank {len(dims)} ({_fmt(dims)}); save each sample preprocessed as the "
                       "model takes it (a stacked array: the samples along its first axis)")
    for k, (got, want) in enumerate(zip(shape, dims)):
        if k == 0 and want == 1 and got > 1:
            raise PTQError(f"{role} sample {where!r} for input {name!r} holds a batch of {got} but the model takes "
                           f"one at a time ({_fmt(dims)}); save one sample per file, or stack the samples along a "
                           "first axis of their own")
        if want and got != want:
            raise PTQError(f"{role} sample {where!r} for input {name!r} has shape {tuple(shape)} but "
                           f"the model expects {_fmt(dims)} (dim {k} differs); check resizing and layout "
                           f"(NCHW vs NHWC)")
    if dtype is not None and np.dtype(dt).kind != np.dtype(dtype).kind:
        raise PTQError(f"{role} sample {where!r} for input {name!r} has dtype {np.dtype(dt)} but the "
                       f"model expects {np.dtype(dtype)}; convert it with astype before saving")


def type_info(dtype):
    """numpy's finfo or iinfo of a numeric ``dtype``: the values it holds (``.min``, ``.max``)."""
    return np.finfo(dtype) if np.dtype(dtype).kind == "f" else np.iinfo(dtype)


def extended_float(dtype):
    """Whether ``dtype`` is one of ml_dtypes' floats (bfloat16, the float8s): numbers numpy
    stores but does not compute on, which samples are read as float32 from."""
    dtype = np.dtype(dtype)
    return dtype.kind == "V" and dtype.names is None and dtype.name.startswith(("bfloat", "float"))


def _fmt(dims):
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def largest_float(feeds):
    """The largest magnitude among a sample's float inputs (0 without any): what tells data
    that overflows a model from a model that breaks."""
    return max((float(np.max(np.abs(v))) for v in feeds.values() if np.asarray(v).dtype.kind == "f" and np.size(v)),
               default=0.0)


# Float inputs beyond this magnitude are no preprocessing's usual range (pixels reach 255, audio
# 32768): a model giving non-finite values on them overflows on its data; below, its own
# arithmetic is the first suspect.
LARGE_INPUT = 1e6


def overflows(what, output, i, feeds):
    """The PTQError for sample ``i`` (``feeds``) on which ``what`` (the model, as run: "the
    float model 'f.onnx'", ...) gives non-finite values in ``output``: the data's to check
    where its inputs are beyond :data:`LARGE_INPUT`, else the model's arithmetic."""
    largest = largest_float(feeds)
    where = f"{what} gives non-finite values in output {output!r} on sample {i}, whose float inputs reach {largest:.3g} " \
            "in magnitude"
    if largest >= LARGE_INPUT:
        return NonFinite(f"{where}: the model overflows on its data; check that sample and its preprocessing")
    return NonFinite(f"{where}: on inputs that small, the model's own arithmetic gives them (a Log or Sqrt of a negative "
                    "value, a division by zero, an Exp that overflows); check the model's computation of that output, "
                    "then that sample and its preprocessing")


def load_data(calibrated_data, qmodel=None, data_num=None, role="calibration", calibration=None):
    """Open calibration data and validate it against ``qmodel`` when given; ``role`` names the
    data in messages (``"held-out"`` for held-out data). Held-out data that are the
    ``calibration`` data (the same folder, or a copy: as many samples, the first, middle and
    last equal) are refused: a figure on them would be labelled held out and hold nothing out.

    Accepted forms: a folder ``DIR/<input>/<i>.npy`` (numeric order), a folder of
    ``<input>.npy`` stacked arrays (samples on axis 0), a single ``.npz`` (one key per input,
    samples stacked on axis 0), a mapping ``{input: [array, ...]}`` (or samples stacked on axis
    0: ``np.load``'s archive too), or a list of feed dicts ``[{input: array}, ...]`` or what
    yields them (an onnxruntime ``CalibrationDataReader``, rewound where it can be, or an
    iterator), read once into memory.
    """
    data_num = params.data_num(data_num)
    calibrated_data = _fed(calibrated_data, role, data_num)
    if isinstance(calibrated_data, (list, tuple)) and calibrated_data and all(
            isinstance(s, Mapping) for s in calibrated_data):
        calibrated_data = _by_input(calibrated_data, role)
    if isinstance(calibrated_data, CalibrationData):
        data = calibrated_data
    elif isinstance(calibrated_data, Mapping):  # a dict, np.load's NpzFile, a MappingProxyType
        data = CalibrationData({k: _Source(f"{k}", _listed(k, calibrated_data[k], role), role)
                                for k in calibrated_data}, "<mapping>", role=role)
    elif isinstance(calibrated_data, (np.ndarray, list, tuple)):
        raise PTQError(f"{role} data must be a folder, an .npz file, a mapping {{input name: samples}} or a list of "
                       f"feed dicts {{input name: array}}, got {shown(calibrated_data)}; pass {{'<input name>': "
                       "array} with the samples along the array's first axis")
    else:
        path = params.data_path(calibrated_data, f"{role} data")
        sources = _open_dir(path, role) if path.is_dir() else _open_npz(path, role)
        data = CalibrationData(sources, str(path), path, role)
    data = data.first(data_num)
    if qmodel is not None:
        data.validate(qmodel)
    if calibration is not None and _same_data(data, calibration):
        raise PTQError(f"the {role} data {data.where!r} are the calibration data {calibration.where!r}: figures on "
                       "them would be labelled held out while holding nothing out; give samples the model was not "
                       "calibrated on, or no held-out data")
    return data


def _fed(data, role, data_num=None):
    """The feed dicts a CalibrationDataReader or an iterator yields (the first ``data_num``:
    an endless generator stops there), as a list; other data as given."""
    if callable(getattr(data, "get_next", None)):  # a CalibrationDataReader, of any quantizer
        _rewound(data)  # quantize_static read it to the end already
        feeds = list(itertools.islice(iter(data.get_next, None), data_num))
        _rewound(data)  # as found, for the caller's next use
        if not feeds:
            raise PTQError(f"the {role} data reader {type(data).__name__} yielded no sample (a reader read to the end "
                           "by the quantizer stays empty); pass a fresh reader, give it a rewind() method, or save "
                           "the samples to a folder")
    elif isinstance(data, Iterator):  # a generator: read once
        feeds = list(itertools.islice(data, data_num))
        if not feeds:
            raise PTQError(f"the {role} data iterator yielded no sample (an iterator read once already stays empty); "
                           "pass a list of feed dicts, or save the samples to a folder")
    else:
        return data
    if not all(isinstance(f, Mapping) for f in feeds):
        bad = next(f for f in feeds if not isinstance(f, Mapping))
        raise PTQError(f"the {role} data yielded {shown(bad)}, not a feed dict {{input name: array}}; yield one "
                       "dict per sample, as onnxruntime's CalibrationDataReader does")
    return feeds


def _rewound(reader):
    """Rewind a reader that can be: one whose rewind() fails is read from where it stands
    (and an empty one says so)."""
    rewind = getattr(reader, "rewind", None)
    if callable(rewind):
        with contextlib.suppress(Exception):  # the user's reader: what it yields decides
            rewind()


def _same_data(data, other):
    """Whether ``data`` are ``other``: one folder or file, or a copy of it."""
    paths = [getattr(d, "path", None) for d in (data, other)]
    if None not in paths and os.path.realpath(paths[0]) == os.path.realpath(paths[1]):
        return True
    if not isinstance(other, CalibrationData) or len(data) != len(other) or set(data.names) != set(other.names):
        return False
    for i in sorted({0, len(data) // 2, len(data) - 1}):
        a, b = data.sample(i), other.sample(i)
        if any(np.shape(a[n]) != np.shape(b[n]) or not np.array_equal(a[n], b[n]) for n in a):
            return False
    return True


def _by_input(feeds, role):
    """``{input: [array, ...]}`` of a list of feed dicts (what a CalibrationDataReader yields)."""
    names = list(feeds[0])
    for i, feed in enumerate(feeds):
        if set(feed) != set(names):
            raise PTQError(f"{role} data: feed dict {i} holds inputs {sorted(feed)}, the first one {sorted(names)}; "
                           "give every sample the same inputs")
    return {k: [feed[k] for feed in feeds] for k in names}


def _listed(name, value, role):
    """The samples of input ``name`` in a mapping: a list (or tuple) of arrays, or an array
    with the samples on its first axis."""
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, np.ndarray) and value.ndim:
        return list(value)
    raise PTQError(f"{role} data for input {name!r} must be a list of arrays, one per sample, or an array "
                   f"with the samples along its first axis; got {shown(value)}")


def _holds_objects(path, member=None):
    """True when the .npy header of ``path`` (of its archive's ``member``) declares Python
    objects: an object array, which np.save and np.savez write for samples of different
    shapes (a ragged list). Read from the header alone, never unpickled."""
    try:
        with contextlib.ExitStack() as stack:
            f = stack.enter_context(open(path, "rb"))
            if member is not None:
                f = stack.enter_context(stack.enter_context(zipfile.ZipFile(f)).open(f"{member}.npy"))
            major, _ = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
            return read(f)[2].hasobject
    except Exception:  # noqa: BLE001 - a header that does not read is the caller's damaged file
        return False


def _object_array(where, role):
    # never unpickled: loading a pickle runs whatever code its author put there
    return PTQError(f"{role} {where} holds an object array, which numpy stores pickled and pytest-ptq never loads "
                    "(unpickling runs code), as np.save writes samples of different shapes that cannot be stacked; "
                    "save one .npy per sample (DIR/<input>/0.npy, 1.npy, ...), or pass the samples as a list or "
                    "mapping of arrays in Python")


def _open_npz(path, role):
    loaded, key = None, None
    try:
        loaded = np.load(path, allow_pickle=False)
        arrays = None
        if not isinstance(loaded, np.ndarray):
            arrays = {}
            for key in loaded.files:
                arrays[key] = loaded[key]
    # a damaged member surfaces as zlib's error or a short read, not as a bad zip
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, zlib.error) as exc:
        if key is not None and _holds_objects(path, key):
            raise _object_array(f"data {str(path)!r}, key {key!r},", role) from None
        why = "its compressed data is damaged" if isinstance(exc, zlib.error) else type(exc).__name__
        raise PTQError(f"{role} file {str(path)!r} is not a readable .npz archive "
                       f"({why}); re-save it with numpy.savez") from None
    finally:
        if hasattr(loaded, "close"):  # the archive's file (an array is read whole)
            loaded.close()
    if arrays is None:  # a .npy file under an .npz name: no input names
        raise PTQError(f"{role} file {str(path)!r} holds one array (a .npy file), not an .npz archive of arrays "
                       "named by input; save it with numpy.savez(path, <input name>=samples), or name it .npy")
    arrays = {k: _stacked(a, f"{str(path)!r}, key {k!r},", role) for k, a in arrays.items()}
    return {k: _Source(f"{path}:{k}", [(f"{path}:{k}[{i}]", a, i) for i in range(len(a))], role)
            for k, a in arrays.items()}


def _read_npy(path, role, mmap_mode=None):
    """The array of .npy file ``path``, or one sentence saying it is not one (an .npz archive
    saved under a .npy name loads as an archive)."""
    try:
        arr = np.load(path, mmap_mode=mmap_mode, allow_pickle=False)
    except Exception as exc:
        if _holds_objects(path):
            raise _object_array(f"file {str(path)!r}", role) from None
        raise PTQError(f"{role} file {str(path)!r} is not a readable .npy array "
                       f"({type(exc).__name__}); re-save it with numpy.save") from None
    if not isinstance(arr, np.ndarray):
        if hasattr(arr, "close"):
            arr.close()
        raise PTQError(f"{role} file {str(path)!r} is not a readable .npy array (it is an .npz archive); "
                       "re-save it with numpy.save, or pass the archive itself as the data")
    return arr


def _stacked(arr, where, role):
    """``arr``, whose first axis holds the samples; one sentence for a 0-d array."""
    if np.ndim(arr) == 0:
        raise PTQError(f"{role} data {where} holds one value, not samples stacked along a first axis; save "
                       "an array of shape [samples, ...] (or one .npy file per sample)")
    return arr


# files that may hold samples in another form: one numbered as no .npy sample is would be a
# sample left out, silently (notes, labels and an image beside its own array are no samples)
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp"}
OTHER_SAMPLE_SUFFIXES = {".npz", ".bin", ".raw", ".dat", ".pt", ".pth", ".pkl", ".pickle", ".gz", ".zip", ".h5",
                         ".hdf5", ".pb", ".tensor"} | IMAGE_SUFFIXES


def _npy_files(folder, role="data"):
    """The .npy files in ``folder`` (the suffix in any case), sorted; one that is not a regular
    file is refused, not skipped: the samples used would silently differ from those given."""
    found = []
    for p in folder.iterdir():
        # hidden files are not samples: macOS leaves ._0.npy beside 0.npy on foreign disks
        if p.name.startswith(".") or p.suffix.lower() != ".npy":
            continue
        if not p.is_file():
            raise PTQError(f"{role} file {str(p)!r} is not a regular file (a folder, a device, a pipe or a broken "
                           "link); save each sample as a .npy file, or move it out")
        found.append(p)
    return sorted(found)


def _left_out(folder, files, role):
    """Refuse a file of ``folder`` in a sample format other than .npy whose name numbers a
    sample no .npy file holds (``3.npz`` beside ``0.npy`` to ``2.npy``): it would be left out."""
    runs = [_digit_runs(f) for f in files]
    at = _telling_run(runs)
    held = {int(r[at]) for r in runs}
    for p in sorted(folder.iterdir()):
        suffix = p.suffix.lower()
        if p.name.startswith(".") or suffix not in OTHER_SAMPLE_SUFFIXES or not p.is_file():
            continue
        mine = _digit_runs(p)  # numbered as the samples beside it are
        n = int(mine[at]) if len(mine) == len(runs[0]) else int(mine[0]) if mine else None
        if n is None or n in held:
            continue  # a note, or the original of a sample held (its image, say)
        if suffix in IMAGE_SUFFIXES:
            raise PTQError(f"{role} file {str(p)!r} is an image, not the array the model takes, so sample {n} would "
                           "be left out; save each sample preprocessed as the model reads it (resized, normalised, "
                           "laid out) with numpy.save")
        raise PTQError(f"{role} file {str(p)!r} is not a .npy sample, so sample {n} would be left out; re-save it with "
                       "numpy.save (one array per file) or move it out")


def _numbered(folder, files, role):
    """``files`` in sample order. Every name must carry a sample number, once: the order
    decides which samples ``data_num`` keeps and which files of several inputs form one
    sample, so it is never guessed."""
    numbers = {}
    unnumbered = []
    for f, n in zip(files, _sample_numbers(files)):
        if n is None:
            unnumbered.append(f.name)
        elif n in numbers:
            raise PTQError(f"{role} folder {str(folder)!r} has two files for sample {n} "
                           f"({numbers[n].name!r} and {f.name!r}); keep one file per sample number")
        else:
            numbers[n] = f
    if unnumbered:
        listed = ", ".join(repr(n) for n in unnumbered[:3]) + (" ..." if len(unnumbered) > 3 else "")
        raise PTQError(f"{role} folder {str(folder)!r} has files without a sample number ({listed}), so "
                       "their order is unknown; name the samples 0.npy, 1.npy, ... or move the others out")
    return [numbers[n] for n in sorted(numbers)]


def _open_dir(path, role):
    subdirs = sorted(p for p in path.iterdir()
                     if p.is_dir() and not p.name.startswith(".") and p.suffix.lower() != ".npy")
    stacked = _npy_files(path, role)
    sources, numbers = {}, {}
    for d in subdirs:
        files = _numbered(d, _npy_files(d, role), role)
        if not files:
            nested = sorted(p.relative_to(path).as_posix() for p in d.iterdir() if p.is_dir() and _npy_files(p, role))
            if nested:  # an input named like 'serving_default/input_1:0', saved as DIR/<input>/<i>.npy
                raise PTQError(f"{role} folder {str(d)!r} holds no .npy files but a folder of them ({nested[0]!r}): "
                               f"an input name with a '/' such as {nested[0]!r} cannot be a folder name; save the "
                               "data as an .npz with one key per input name (samples stacked on axis 0)")
            raise PTQError(f"{role} folder {str(d)!r} holds no .npy files; save one sample per file "
                           "as 0.npy, 1.npy, ...")
        _left_out(d, files, role)
        sources[d.name] = _Source(str(d), files, role)
        numbers[d.name] = sorted(_sample_numbers(files))
    if len({tuple(v) for v in numbers.values()}) > 1:
        first, *others = numbers
        for other in others:
            missing = sorted(set(numbers[first]) ^ set(numbers[other]))
            if missing:
                n = missing[0]
                has, lacks = (first, other) if n in numbers[first] else (other, first)
                raise PTQError(f"{role} data {str(path)!r} has sample {n} for input {has!r} but not for "
                               f"{lacks!r}; give every input the same sample numbers")
    for f in stacked:
        if f.stem in sources:
            raise PTQError(f"{role} data {str(path)!r} has both a folder {f.stem!r} and a file {f.name!r} for input "
                           f"{f.stem!r}; keep one of them (samples stacked in the file, or one per file in the folder)")
        arr = _stacked(_read_npy(f, role, mmap_mode="r"), repr(str(f)), role)
        sources[f.stem] = _Source(str(f), [(f"{f}[{i}]", arr, i) for i in range(len(arr))], role)
    if not sources:
        raise PTQError(f"{role} data {str(path)!r} holds neither input folders nor .npy files; "
                       "lay it out as DIR/<input name>/<i>.npy")
    return sources

"""onnxruntime as the engine uses it: providers, session options, sessions and their errors.

This is the one module that creates onnxruntime sessions and turns their failures into a
:class:`~pytest_ptq.errors.PTQError` that quotes onnxruntime's own words (the node and the
reason), so every analysis reports a failure the same way.
"""

from __future__ import annotations

import functools
import os
import threading
import warnings
import weakref

from .. import params
from ..errors import InputRefused, ModelFailed, PTQError, RunFailed, unknown

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
    if cuda_usable():
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def asked_providers(providers):
    """The execution providers a caller named (:func:`~pytest_ptq.params.providers`), or None
    when none was: refused where this onnxruntime lacks one, or has CUDA's but it cannot run
    here, rather than onnxruntime's quiet fallback to the CPU."""
    providers = params.providers(providers)
    if providers is None:
        return None
    available = ort().get_available_providers()
    missing = [p for p in providers if p not in available]
    if missing:
        raise PTQError(f"execution provider {', '.join(missing)} is not in this onnxruntime (it has "
                       f"{', '.join(available)}); install the build that has it (onnxruntime-gpu for CUDA), or leave "
                       "providers out for the best one here")
    if "CUDAExecutionProvider" in providers and not cuda_usable():
        raise PTQError("CUDAExecutionProvider is installed but does not run here (no GPU, or CUDA's libraries are "
                       "missing); leave providers out to run on the CPU")
    return providers


@functools.cache
def cuda_usable():
    """Whether onnxruntime's CUDA provider runs here. onnxruntime-gpu lists it wherever it is
    installed, and a session asked for it without a GPU or CUDA's libraries falls back to
    the CPU, logging an error per session; one probe on a one-node model tells instead."""
    if "CUDAExecutionProvider" not in ort().get_available_providers():
        return False
    from onnx import TensorProto

    try:
        session = _probe("Relu", TensorProto.FLOAT, (1,), TensorProto.FLOAT, [], ["CUDAExecutionProvider",
                                                                                 "CPUExecutionProvider"])
    except Exception:  # any failure to start the provider means: not here
        return False
    return "CUDAExecutionProvider" in session.get_providers()


@functools.cache
def integer_kernels_saturate():
    """Whether onnxruntime's CPU kernels multiplying uint8 activations by int8 weights
    saturate here. On x86 CPUs without AVX-VNNI they sum the products in pairs into int16
    (onnxruntime documents it), so pairs beyond 32767 are clipped; one probe of the largest
    codes tells."""
    import numpy as np
    from onnx import TensorProto, numpy_helper

    weight = numpy_helper.from_array(np.full((64, 1), 127, np.int8), "w")
    try:
        session = _probe("MatMulInteger", TensorProto.UINT8, (1, 64), TensorProto.INT32, [weight],
                         ["CPUExecutionProvider"])
        got = session.run(None, {"x": np.full((1, 64), 255, np.uint8)})[0]
    except Exception:  # noqa: BLE001 - a build without the kernel: nothing known, nothing said
        return False
    return int(got.ravel()[0]) != 255 * 127 * 64


def _probe(op, x_type, shape, y_type, initializers, providers):
    """A session over one ``op`` node of input ``x`` (and ``initializers``), logging nothing."""
    from onnx import helper

    rt = ort()
    x = helper.make_tensor_value_info("x", x_type, list(shape))
    y = helper.make_tensor_value_info("y", y_type, None)
    node = helper.make_node(op, ["x", *(i.name for i in initializers)], ["y"])
    model = helper.make_model(helper.make_graph([node], "probe", [x], [y], initializers),
                              opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    options = rt.SessionOptions()
    options.log_severity_level = 4  # a fallback's error is the answer, not news
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return rt.InferenceSession(model.SerializeToString(), options, providers=providers)


def check_level(optimization):
    """Reject an unknown graph optimisation level before any work is done."""
    if not isinstance(optimization, str) or optimization not in LEVELS:
        raise unknown("optimization level", optimization, list(LEVELS))
    return optimization


class SharedWeights:
    """Large initializers held once, as OrtValues over numpy arrays, and given to every session
    (SessionOptions.add_initializer) instead of a copy per session.

    ``low_memory`` also turns off prepacking: a prepacked weight is a private copy per
    session (measured: four sessions of a 192 MiB MatMul stack hold 1 GiB prepacked, 30 MiB
    shared); convolution nets lose about 8% of speed without it (MatMul stacks none that
    the sessions' own copies do not cost back, see :func:`.core.shares_weights`).
    """

    def __init__(self, arrays=None, low_memory=False):
        self.arrays = dict(arrays or {})
        self.low_memory = low_memory
        self._values = {}

    @property
    def nbytes(self):
        return sum(a.nbytes for a in self.arrays.values())

    def add(self, arrays):
        self.arrays.update(arrays)

    def prepare(self, so, model):
        """``(model, optimizers to disable, bytes of file-mapped weights it reads)`` for a
        session over ``model``'s placeholders.

        Fast mode embeds the values in the session's own copy, as any model holds them. Low
        mode gives ``so`` the shared values instead, and disables the optimizers that read
        initializer values from the model's TensorProtos, not from the shared values, while
        loading: constant folding (measured on a float8 weight pair inside an If), the NCHWc
        layout transform of float convolutions (which would reorder a private copy of each
        weight anyway; convolution nets run slower without it), and the fusions that fold a
        constant Mul or a BatchNormalization into a weight (a private copy too; a CRNN whose
        convolutions are followed by per-channel Muls)."""
        from ..model.graph import PACKED, SHARED_LOCATION, is_placeholder, mapping, restore

        names = [i.name for i in model.graph.initializer if is_placeholder(i)]
        if not names:
            return model, [], 0
        if not self.low_memory:
            return restore(model, self.arrays), [], 0
        import numpy as np

        # no OrtValue holds sub-byte codes unpacked, as numpy has them: the model holds them,
        # packed, a copy per session at an eighth of their float size
        packed = {i.name: self.arrays[i.name] for i in model.graph.initializer
                  if is_placeholder(i) and i.data_type in PACKED}
        if packed:
            model = restore(model, packed)
            names = [n for n in names if n not in packed]
        so.add_session_config_entry("session.disable_prepacking", "1")
        _return_freed_memory(self)
        # without the arena, the dequantized weights a gated run computes are freed as soon as
        # they are used, instead of growing a pool that keeps one per layer
        so.enable_cpu_mem_arena = False
        mapped = 0
        for name in names:
            if name not in self._values:
                array = np.asarray(self.arrays[name], order="C")  # a scalar stays 0-d
                self._values[name] = _ort_value(array)
                PAGER.watch(array)
            if mapping(self.arrays[name]) is not None:
                mapped += self.arrays[name].nbytes
            so.add_initializer(name, self._values[name])
        # onnxruntime checks that a placeholder's external file exists before the shared value
        # replaces it: one empty file in a private temporary folder, for every session
        so.add_session_config_entry("session.model_external_initializers_file_folder_path", self._marker(SHARED_LOCATION))
        return model, ["ConstantFolding", "NchwcTransformer", "ConvMulFusion", "ConvBNFusion", "MatMulBnFusion"], mapped

    @staticmethod
    def _marker(location):
        """The folder holding the placeholder file ``location``: the package's own copy, so
        that nothing is written (a temporary folder per process was left behind by a killed
        run); a temporary one only where an install lost that file."""
        global _MARKERS
        if _MARKERS is None:
            here = os.path.dirname(os.path.abspath(__file__))
            if os.path.isfile(os.path.join(here, location)):
                _MARKERS = here
            else:
                import atexit
                import shutil
                import tempfile

                _MARKERS = tempfile.mkdtemp(prefix="ptq-shared-")
                atexit.register(shutil.rmtree, _MARKERS, ignore_errors=True)
                with open(os.path.join(_MARKERS, location), "wb") as fh:
                    fh.write(b"\0")
        return _MARKERS


_MARKERS = None  # the folder of SharedWeights' placeholder file


def _ort_value(array):
    """An OrtValue over ``array``'s memory. numpy knows the 8- and 16-bit floats (float8,
    bfloat16) only as ml_dtypes' types, which onnxruntime refuses: their bits are given as
    unsigned integers of that size, with the ONNX type."""
    import numpy as np
    import onnx

    if array.dtype.kind == "V":
        bits = {1: np.uint8, 2: np.uint16}[array.dtype.itemsize]
        return ort().OrtValue.ortvalue_from_numpy_with_onnx_type(
            array.view(bits), onnx.helper.np_dtype_to_tensor_dtype(array.dtype))
    return ort().OrtValue.ortvalue_from_numpy(array)


class Pager:
    """Keeps the pages of memory-mapped weights that runs read from growing this process's
    resident set past a ceiling: before a run whose weights would take them past it they are
    handed back (:meth:`make_room`), and while any run is in flight a thread looks every
    :attr:`PERIOD` seconds or sooner (see :meth:`release`), and once more when a run ends,
    and hands them back whenever they are within a weight of it.

    A weight mapped from its file (external data, or an inline tensor of the .onnx, see
    :func:`~pytest_ptq.model.graph.load_mapped`) is shared with onnxruntime without a copy,
    but every page a run reads stays mapped, so a run over every layer left all the weights
    resident. Dropping a read-only shared file mapping's pages (madvise MADV_DONTNEED) is
    exact: the next read faults them back in from the page cache, which the kernel keeps or
    reclaims as memory allows. The ceiling is on the resident pages of mapped files: the
    shared libraries' (measured as each mapping is first given to a session, with every
    weight mapping's pages handed back) plus a quarter of the bytes of file the weight
    mappings cover (a range mapped twice counted once), what a plain session holds for the
    same weights as int8. Below it pages stay. Measured (bench/bench_memory.py, activation
    sensitivity): a 192 MiB MatMul stack with external data peaks at 218 MiB instead of 318,
    a 1 GiB one at 457 MiB instead of 1146 (1.04x a fused plain session); the 1 GiB stack
    behind lone DQs, its float model given, at 461 MiB (1.39x) instead of 933 since the
    ceiling counts a file range once, the floor holds no weight pages and looks come sooner.
    Looks alone let a run overshoot: its layers fault in faster than any look catches (16 MiB
    in under a millisecond), so the 192 MiB stack behind lone DQs peaked at 165-197 MiB over
    8 samples (1.53-1.82x); with room made before each run, a weight's margin under the
    ceiling and the float model mapped once, its ranking peaks at 124-137 MiB and the whole
    run at 151 MiB, set by the check's quantized whole-graph pass, which only the looks bound.
    The price is the refaults: mapping pages back costs about 0.1 ms per MiB, and a config of
    a memory-bound model reads its downstream weights once, so the stacks' activation
    rankings take 2.2-2.5x as long (192 MiB, 8 samples: 1.1 -> 2.75 s; a ceiling of half the
    bytes 2.3 s at 266 MiB, of all of them 1.6 s at 330 MiB). Low-memory mode only, where
    sessions share the mapped arrays (fast mode embeds copies). A no-op without madvise.
    """

    PERIOD = 0.01  # seconds between looks at the resident set, at most
    MIN_PERIOD = 0.001  # and at least, near the ceiling while pages fault in fast
    SHARE = 0.25  # of the mapped bytes that may stay resident

    def __init__(self):
        import threading
        import weakref

        self._maps = weakref.WeakSet()
        self._lock = threading.Lock()
        self._busy = threading.Event()
        self._running = 0
        self._thread = None
        self.floor = None  # resident file bytes without the mappings' pages (see watch)
        self.largest = 0  # bytes of the largest watched weight: what one node faults in at once
        self.period = self.PERIOD  # seconds until the next look while runs are in flight
        self._last = None  # (time, resident bytes) after the last look
        self._rate = 0.0  # the fastest growth of the resident set seen between looks, bytes/s

    @staticmethod
    def resident():
        """Bytes of files mapped into this process and resident (the mapped weights, and the
        shared libraries' pages); None where /proc is not there."""
        try:
            with open("/proc/self/statm") as fh:
                return int(fh.read().split()[2]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            return None

    def watch(self, array):
        """Keep the weight mappings' pages under the ceiling from now on, when ``array`` (a
        weight given to a session) is a view on a file mapping."""
        from ..model.graph import hand_back, mapping

        mm = mapping(array)
        if mm is None:
            return
        with self._lock:
            self.largest = max(self.largest, array.nbytes)
            if mm in self._maps:
                return
            self._maps.add(mm)
            # the pages read before the sessions (an analysis of the weights, the alignment)
            # go now, and the floor is the lowest resident set seen with none of them: the
            # libraries' pages. At the first, every weight mapping's, not only the sessions':
            # one left resident would count in the floor for good (a 1 GiB model's int8
            # weights, read by the alignment before the first session: a floor of 306 MiB);
            # later ones only their own (the looks hand back every mapping's pages anyway,
            # and a model of thousands of weights would make this quadratic)
            if self.floor is None:
                self._hand_back_all()
            else:
                hand_back(mm)
            resident = self.resident() or 0
            self.floor = resident if self.floor is None else min(self.floor, resident)

    @staticmethod
    def _hand_back_all():
        from ..model.graph import file_mappings, hand_back

        for mm in file_mappings():
            hand_back(mm)

    def ceiling(self):
        """Resident bytes of mapped files above which weight pages are handed back."""
        from ..model.graph import mapped_bytes

        return self.floor + self.SHARE * mapped_bytes()

    def make_room(self, nbytes):
        """Before a run that reads ``nbytes`` of mapped weights: hand back the resident pages
        now if that run would take the process past the ceiling. A segment's run faults its
        weights in faster than any look catches (a 192 MiB MatMul stack: 64 MiB in 2.6 ms,
        between two looks 1 ms apart), so a run is kept under the ceiling before it starts."""
        if not self._maps or not nbytes:
            return
        resident = self.resident()
        if resident is None or resident + nbytes > self.ceiling():
            self._hand_back_all()

    def release(self):
        """Hand back every weight mapping's resident pages if this process is above the
        ceiling, and decide when to look next (:attr:`period`)."""
        import time

        before = after = self.resident()
        ceiling = self.ceiling()
        # a node faults its weight in within a millisecond, between two looks: handing back one
        # weight's bytes below the ceiling keeps that burst under it, unless the room left
        # would not hold two weights (a node's and its successor's), which would refault a
        # weight still being read (convolutions reread theirs throughout)
        limit = max(ceiling - self.largest, min(ceiling, self.floor + 2 * self.largest))
        if before is None or before >= limit:
            self._hand_back_all()
            after = self.resident()
        now, last = time.monotonic(), self._last
        if last is not None and before is not None and before > last[1]:
            self._rate = max(self._rate, (before - last[1]) / max(now - last[0], 1e-4))
        # the next look comes before pages faulting in at the fastest pace seen pass the
        # limit: runs fault them in bursts (a memory-bound MatMul stack reads a GiB of
        # weights in 150 ms, 64 MiB above the ceiling between looks 10 ms apart), while a
        # convolution reads its weight and then computes for long, so a convolution net's
        # looks far below the limit stay 10 ms apart
        self.period = self.PERIOD if not self._rate or after is None else \
            min(self.PERIOD, max(self.MIN_PERIOD, (limit - after) / self._rate))
        self._last = (now, after) if after is not None else None

    def __enter__(self):
        if not self._maps:
            return self
        with self._lock:
            self._running += 1
            self._busy.set()
            if self._thread is None:
                import threading

                self._thread = threading.Thread(target=self._loop, name="ptq-pager", daemon=True)
                self._thread.start()
        return self

    def __exit__(self, *exc):
        if not self._maps:
            return
        with self._lock:
            self._running = max(0, self._running - 1)
            if not self._running:
                self._busy.clear()
        self.release()

    def _loop(self):
        import time

        while True:
            self._busy.wait()
            time.sleep(self.period)
            if self._busy.is_set():
                self.release()


PAGER = Pager()


def _libc_call(function, *args):
    """Call glibc's ``function`` if this process has it (Linux); a no-op elsewhere."""
    import ctypes
    import ctypes.util

    global _LIBC
    if _LIBC is None:
        name = ctypes.util.find_library("c")
        try:
            _LIBC = ctypes.CDLL(name) if name else False
        except OSError:  # no C library to load by that name: nothing to tune
            _LIBC = False
    if _LIBC and hasattr(_LIBC, function):
        getattr(_LIBC, function)(*args)


_LIBC = None


def _return_freed_memory(owner):
    """Keep glibc's malloc handing large blocks back to the system when freed, while ``owner``
    (a low-memory engine's weights) lives. By default it raises its mmap threshold after the
    first large free, and from then on keeps every freed dequantized weight in the heap
    (measured: 700 MiB instead of 280 MiB for a 192 MiB MatMul stack). Process-wide, and
    glibc's own adjustment cannot be given back once set: see :func:`_malloc_owner_gone` for
    what the process gets when the last owner goes. A no-op without glibc."""
    with _MALLOC_LOCK:  # an owner's finalizer runs in whichever thread drops it
        if id(owner) in _MALLOC_OWNERS:
            return
        if not _MALLOC_OWNERS:
            _libc_call("mallopt", _M_MMAP_THRESHOLD, 128 * 1024)  # fixed, which also stops its adjustment
            _libc_call("mallopt", _M_TRIM_THRESHOLD, 128 * 1024)  # glibc's default, which an earlier owner's end raised
        _MALLOC_OWNERS.add(id(owner))
    weakref.finalize(owner, _malloc_owner_gone, id(owner))


def _malloc_owner_gone(key):
    """The last low-memory owner gone: the thresholds the rest of the process (a notebook,
    the user's later tests) runs under, glibc's adjustment being off for good. A user's loop
    of numpy temporaries ran 18x slower at the owner's 128 KiB (each mapped and unmapped);
    at 32 MiB with the trim threshold left at 128 KiB, loops of 2-16 MiB temporaries ran
    3-11x slower (the heap's top handed back and taken again each time) and 24 temporaries
    of 20 MiB beside small kept arrays stayed resident once freed (480 MiB). 16 MiB, with
    glibc's own trim threshold for it (twice), kept both within glibc's default but for
    loops of 16-32 MiB temporaries, 2-3x slower, while freed blocks of 16 MiB or more go back
    to the system (glibc's default keeps them once it has freed one that size): measured in
    docs/performance.md."""
    with _MALLOC_LOCK:
        _MALLOC_OWNERS.discard(key)
        if not _MALLOC_OWNERS:
            _libc_call("mallopt", _M_MMAP_THRESHOLD, 16 * 2**20)
            _libc_call("mallopt", _M_TRIM_THRESHOLD, 32 * 2**20)
            _libc_call("malloc_trim", 0)  # what the engine's runs freed into the heap


_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MALLOC_OWNERS = set()  # the low-memory weights alive (by id)
_MALLOC_LOCK = threading.Lock()


def trim_memory():
    """Ask glibc to hand freed heap memory back to the system (after sessions are dropped);
    a no-op elsewhere."""
    _libc_call("malloc_trim", 0)


_THREADS = 0  # intra-op threads of every session; 0: onnxruntime's default (one per core)


_PEERS = None  # (folder, this process's file) while processes share the machine's cores


def machine_cores():
    """The cores this process may run on: those of its CPU affinity (``taskset``, a
    container's cpuset), not the whole machine's, where the system says."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # no affinity on macOS and Windows
        return os.cpu_count() or 1


def share_cores(processes, folder=None):
    """Give this process's sessions ``1/processes`` of the machine's cores: pytest-xdist
    workers each running onnxruntime on every core would only take turns. ``folder``: where
    each process sharing them keeps a file while it runs, so that one left alone can keep
    every core busy again (see :func:`spare_cores`)."""
    global _THREADS, _PEERS
    _THREADS = max(1, machine_cores() // max(1, int(processes))) if processes and processes > 1 else 0
    if folder is not None and _THREADS and _PEERS is None:
        import atexit

        os.makedirs(folder, exist_ok=True)
        mine = os.path.join(folder, str(os.getpid()))
        open(mine, "w").close()
        _PEERS = (folder, mine)
        atexit.register(leave)


def leave():
    """This process stops sharing the cores: its peers may take them (at its end)."""
    global _PEERS
    if _PEERS is not None:
        import contextlib

        with contextlib.suppress(OSError):  # removed with its folder already
            os.remove(_PEERS[1])
        _PEERS = None


def cores():
    """The cores this process's sessions may use (see :func:`share_cores`)."""
    return _THREADS or machine_cores()


def all_cores():
    """The cores this process may keep busy once it is alone: the machine's while processes
    share them (see :func:`share_cores`), else :func:`cores`."""
    return machine_cores() if _PEERS is not None else cores()


_SPARE = [0.0, 0]  # when spare_cores last looked, and what it found
SPARE_LOOKUP_S = 0.5  # how often spare_cores looks at the folder


def spare_cores():
    """The cores this process may keep busy now: its share while its peers run, all of them
    once it is the last (looked up every :data:`SPARE_LOOKUP_S` at most). On 2 cores, the example
    detector's and classifier's contracts under ``-n 2`` took 1.36x serial when the
    detector's worker, left alone, kept running on its one core; 0.97x now."""
    if _PEERS is None:
        return cores()
    import time

    now = time.monotonic()
    if now - _SPARE[0] >= SPARE_LOOKUP_S:
        from ..guard import alive

        try:  # a worker killed (out of memory, a crash) leaves its file: only the living count
            running = sum(1 for n in os.listdir(_PEERS[0]) if n.isdigit() and (int(n) == os.getpid() or alive(int(n))))
        except OSError:
            running = 1
        _SPARE[:] = [now, max(1, machine_cores() // max(1, running))]
    return _SPARE[1]


def session_options(optimization="all", fake_quant=True, optimized_path=None, libraries=(), threads=None):
    """SessionOptions at the given optimisation level.

    ``fake_quant`` keeps Q/DQ as float arithmetic (onnxruntime's QDQ-to-integer fusion off),
    which is what every analysis simulates; False lets onnxruntime fuse Q/DQ into its integer
    kernels (the "integer" stage). ``optimized_path``: where onnxruntime writes the optimised
    model. ``libraries``: custom-op libraries (shared objects) to register. ``threads``:
    intra-op threads of this session (default: the process's share, see :func:`share_cores`).
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
    # onnxruntime's default order runs every node computed from constants first, so a graph
    # that dequantizes its weights at run time (low-memory mode: no constant folding) held
    # all of them at once; priority-based order computes each where it is used (measured,
    # a 192 MiB MatMul stack with every pair quantized in one session: 481 -> 298 MiB, at
    # the same speed on the PP-OCRv4 models)
    so.execution_order = rt.ExecutionOrder.PRIORITY_BASED
    # A memory pattern gives each run one block for all its planned tensors; with several
    # configs in flight, each held its own from the shared arena. Without it, tensors are
    # taken from the arena and given back as the run goes (measured, peaks of fresh
    # processes: PP-OCRv4 detector 205 -> 188 MiB with two configs in flight, 288 -> 241 MiB
    # with eight; recogniser 215 -> 206 MiB; a 16 MiB MatMul stack 118 and 118 MiB; ranking
    # time at 8 samples within the machine's noise: detector 24.4 -> 25.4 s, medians of 7,
    # recogniser 22.4-23.0 -> 20.8-22.1 s)
    so.enable_mem_pattern = False
    if threads or _THREADS:
        so.intra_op_num_threads = threads or _THREADS
    if optimized_path is not None:
        so.optimized_model_filepath = str(optimized_path)
    for lib in libraries:
        try:
            so.register_custom_ops_library(str(lib))
        except Exception as exc:
            raise PTQError(f"onnxruntime cannot load the custom-op library {str(lib)!r} ({first_line(exc)}); check "
                           "that it was built for this onnxruntime and that its own dependencies load") from None
    so.log_severity_level = 3
    if _shared_arena():
        so.add_session_config_entry("session.use_env_allocators", "1")
    return so


_ARENA = None


def _shared_arena():
    """Whether onnxruntime's process-wide CPU arena is registered (done on first use) for the
    engine's sessions to share. Runs are sequential, so one arena sized for the largest
    run serves every segment's sessions, instead of an arena each (measured on the PP-OCRv4
    detector, 2 samples: 223 MiB peak instead of 393 MiB, at the same speed)."""
    global _ARENA
    if _ARENA is None:
        rt = ort()
        try:
            info = rt.OrtMemoryInfo("Cpu", rt.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, rt.OrtMemType.DEFAULT)
            rt.create_and_register_allocator(info, rt.OrtArenaCfg({"arena_extend_strategy": 0}))  # powers of two
            _ARENA = True
        except Exception:  # noqa: BLE001 - another one is registered, or this build lacks it: arenas per session
            _ARENA = False
    return _ARENA


def first_line(exc):
    """The first line of an exception's message, or its type name. onnxruntime's "Got
    invalid dimensions for input: x for the following indices" keeps the lines it announces
    ("index: 0 Got: 12 Expected: 1"): they are what says which axis is wrong."""
    text = str(exc).strip()
    if not text:
        return type(exc).__name__
    lines = text.splitlines()
    listed = [line.strip() for line in lines[1:] if line.strip().startswith("index:")]
    if lines[0].rstrip().endswith("for the following indices") and listed:
        return f"{lines[0].rstrip()}: {'; '.join(listed)}"
    return lines[0]


# onnxruntime's rewrites that delete a Relu or Clip before a QuantizeLinear whose range it
# covers: exact for integer types, wrong or failing for float8 (the Relu rewrite takes zero as
# the floor of a grid that goes below it: outputs 0.23 off the model's own arithmetic on a
# float8 conv net; the Clip one cannot read a float8 zero point and fails the session)
FLOAT8_REWRITES = ("ReluQuantRewrite", "ClipQuantRewrite")
# onnxruntime's level-1 rewrite of a requantize chain (Q/DQ straight into another Q/DQ) into
# one pair, which session.disable_quant_qdq leaves on: a config holding both pairs read what
# neither computes (a chain whose coarse pair alone reads 0.967 read 0.9997 with both), one
# holding either the file's arithmetic. onnxruntime 1.28 on names it so; a name it does not
# know, disabled_optimizers ignores.
CHAIN_MERGE = ("DoubleQDQPairsRemover",)
ALWAYS_DISABLED = FLOAT8_REWRITES + CHAIN_MERGE
# A session whose Q/DQ pairs are inline (a fixed form, see .segments) keeps the plain layout:
# folded constants let the NCHWc transform reorder its convolutions' sums, whose rounding flips
# codes a gated config's (weights chosen at run time: no transform) and a plain session's
# never see. PP-OCR's classifier read 0.99119 fully quantized where every other path,
# a plain session of the file included, reads 0.99143.
INLINE_DISABLED = ALWAYS_DISABLED + ("NchwcTransformer",)


def make_session(model, optimization="all", providers=None, fake_quant=True, optimized_path=None,
                 what="the model", libraries=(), shared=None, threads=None, disabled_optimizers=ALWAYS_DISABLED):
    """An onnxruntime session for a ModelProto (its placeholders filled from ``shared``, a
    :class:`SharedWeights`; ``threads``: see :func:`session_options`); a failure is one
    sentence quoting onnxruntime. ``disabled_optimizers``: onnxruntime's optimizers turned off
    (besides those shared weights need); ``()`` for the file as a plain session deploys it."""
    options = session_options(optimization, fake_quant, optimized_path, libraries, threads)
    given = model
    model, disabled, reads = shared.prepare(options, model) if shared is not None else (model, [], 0)
    # a failure to load is raised below as one sentence quoting onnxruntime (or, for a
    # placeholder another optimizer read, handled): not onnxruntime's error log as well
    options.log_severity_level = 4
    try:
        try:
            session = _loaded(model, options, providers, [*disabled, *disabled_optimizers])
        except Exception as exc:
            if not disabled or "external data" not in str(exc):
                raise
            # another optimizer read a shared weight's placeholder while loading (a fusion
            # that merges weights, say): this session gets its own copy instead
            from ..model.graph import restore

            options = session_options(optimization, fake_quant, optimized_path, libraries, threads)
            session = _loaded(restore(given, shared.arrays), options, providers, list(disabled_optimizers))
            reads = 0
    except PTQError:
        raise
    except Exception as exc:
        if "Could not find an implementation for" in str(exc):
            # a type or opset its kernels do not cover (float4e2m1 Q/DQ, say), not a broken file
            raise PTQError(f"onnxruntime {ort().__version__} cannot load {what}: it has no kernel for one of its nodes "
                           f"({first_line(exc)}); pytest-ptq runs models in onnxruntime, so re-export the model with "
                           "types and opsets its CPU kernels run (int8, int4, float8 QuantizeLinear/DequantizeLinear)"
                           ) from None
        raise PTQError(f"onnxruntime cannot load {what} ({first_line(exc)}); check that it runs in a plain "
                       "onnxruntime session") from None
    if shared is not None and shared.low_memory:
        _LOW_MEMORY[session] = reads
    return session


def _loaded(model, options, providers, disabled):
    """An InferenceSession over ``model``'s bytes that keeps neither them nor the heap they
    took. onnxruntime's Python session holds the serialized model for as long as it lives,
    only to rebuild itself when its providers change or an execution provider fails mid-run,
    neither of which an engine wants (a provider failing mid-analysis is reported, not
    silently swapped for the CPU). And loading copies every weight a session embeds several
    times over (the proto, its bytes, onnxruntime's parse); glibc keeps those freed blocks in
    the heap unless asked to return them. Measured, activation sensitivity on one sample:
    a 48 MiB MatMul stack peaked at 786 MiB before, 674 MiB without the kept bytes and 475
    MiB with the heap returned too; the PP-OCRv4 detector 233 -> 217 MiB with both, at the
    same speed (a trim takes milliseconds)."""
    session = ort().InferenceSession(model.SerializeToString(), options, providers=providers or default_providers(),
                                     disabled_optimizers=disabled)
    session.disable_fallback()
    if getattr(session, "_model_bytes", None) is not None:  # this onnxruntime keeps them there
        session._model_bytes = None
    trim_memory()
    return session


_RUN_OPTIONS = {}


def _run_options(shrink):
    """RunOptions that keep onnxruntime's own error log off stderr: a failure is raised and
    reported once, as a sentence quoting onnxruntime (and a stacked-samples trial that a
    graph rejects is no error at all). ``shrink`` hands the run's arena memory back when it
    ends: a run of stacked samples would otherwise leave every segment's session holding
    buffers for the whole stack (measured on the PP-OCRv4 detector after a trial of 8
    stacked samples: 1.7 GiB held without shrinking, 1.0 GiB with)."""
    if shrink not in _RUN_OPTIONS:
        options = ort().RunOptions()
        options.log_severity_level = 4  # fatal only
        if shrink:
            options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        _RUN_OPTIONS[shrink] = options
    return _RUN_OPTIONS[shrink]


# Low-memory sessions, whose runs all hand their arena memory back: they compute weights at
# run time (dequantized, quantized, gated), and the process's shared arena kept the largest
# run's buffers for good. Measured, activation sensitivity: a 48 MiB MatMul stack 155 -> 139
# MiB, a 180 MiB convolution net 263 -> 228 MiB, and the 192 MiB stack's rankings no slower
# (8 samples, interleaved with the code before: 3.7-3.9 s activations, 1.1-1.2 s weights
# either way). Without any arena instead, the weight rankings took 7x as long (every large
# buffer a fresh mapping); shrinking in fast mode too cost the PP-OCRv4 detector 15%.
# Each one's value: the bytes of file-mapped weights it reads in a run (see Pager.make_room).
_LOW_MEMORY = weakref.WeakKeyDictionary()


def mapped_reads(session):
    """Bytes of file-mapped weights ``session`` reads in a run (0 for a session holding its
    own copies)."""
    return _LOW_MEMORY.get(session, 0)


def run(session, names, feeds, source, shrink=False, float_model=False):
    """``session.run(names, feeds)``; a failure names the model and quotes onnxruntime.
    ``shrink``: return the run's arena memory afterwards (for runs larger than the usual;
    low-memory sessions always do). ``float_model``: ``source`` is the float model given
    beside the quantized one (whose inputs the data were checked against)."""
    reads = _LOW_MEMORY.get(session)  # None: not a low-memory session
    try:
        PAGER.make_room(reads or 0)
        with PAGER:
            return session.run(names, feeds, _run_options(shrink or reads is not None))
    except Exception as exc:
        error = run_error(exc, source, float_model)
        if isinstance(error, InputRefused):
            error.given = unfit(session, feeds)
        raise error from None


def unfit(session, feeds):
    """What ``feeds`` hold for the inputs of ``session`` that do not take them ("'x' float32
    [12, 3, 16, 16] where the model takes float32 [1, 3, 16, 16]"), "" where none is seen to
    differ (a name onnxruntime does not know, say)."""
    import numpy as np

    numpy_name = {"float": "float32", "double": "float64"}  # onnxruntime's names; the others are numpy's
    out = []
    for arg in session.get_inputs():
        if arg.name not in feeds:
            continue
        value = np.asarray(feeds[arg.name])
        want = arg.type.removeprefix("tensor(").removesuffix(")")
        want = numpy_name.get(want, want)
        dims = list(arg.shape or ())
        fits = value.ndim == len(dims) and all(not isinstance(d, int) or d == n for d, n in zip(dims, value.shape))
        if not fits or value.dtype.name != want:
            takes = ", ".join(str(d) if isinstance(d, int) else (d or "?") for d in dims)
            out.append(f"{arg.name!r} {value.dtype} {list(value.shape)} where the model takes {want} [{takes}]")
    return "; ".join(out)


def run_error(exc, source, float_model=False):
    """A PTQError for onnxruntime failing to run ``source``: its own message first, then what
    to check (the data only when onnxruntime complains about an input, an
    :class:`~pytest_ptq.errors.InputRefused`; a float model's inputs that differ from the
    quantized model's: whether it is the right one); a
    :class:`~pytest_ptq.errors.ModelFailed` where nothing in its words points at the data."""
    msg = first_line(exc)
    low = msg.lower()
    if any(k in low for k in ("invalid rank for input", "got invalid dimensions for input",
                              "unexpected input data type", "input name", "missing input", "missing from input feed")):
        hint = ("check that it is the float model this model was quantized from: the data fit the quantized "
                "model's inputs" if float_model else "check the data's shapes and dtypes against the model's inputs")
        return InputRefused(f"onnxruntime failed to run {source!r}: {msg}; {hint}", source, msg)
    if "broadcast" in low:  # shapes that a dynamic model takes one by one but not together
        hint = ("check that the sample's inputs fit each other (token ids and their mask of one length, images of "
                "the sizes the model combines); if they do, check the model in a plain onnxruntime session")
    elif any(k in low for k in ("out of data bounds", "out of range", "out of bounds")):
        hint = "check the data's values: an index outside the range the model takes"
    else:
        return ModelFailed(f"onnxruntime failed to run {source!r}: {msg}; the model does not run as stored in "
                           "onnxruntime; check it in a plain onnxruntime session", source, msg)
    return RunFailed(f"onnxruntime failed to run {source!r}: {msg}; {hint}", source, msg)

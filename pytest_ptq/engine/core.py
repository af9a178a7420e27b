"""The engine: a calibrated QDQ model compiled once, run under any quantization config.

Every calibration node becomes an ``If`` on a boolean feed (see :mod:`.instrument`), so a
config (which calibration nodes are quantized) is a set of feed values, one onnxruntime
session serves every config, and a bypassed pair costs one ``If`` dispatch instead of a
quantize-dequantize over the whole tensor: a config with one quantized node costs about one
float forward pass. Model outputs run through :mod:`.segments`, which reuse the float
prefix a config shares with the reference.

Q/DQ run as fake-quant: onnxruntime's QDQ-to-integer fusion is switched off.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from .. import guard, params
from ..data import load_data
from ..errors import ModelFailed, PTQError, RunFailed, shown, unknown
from ..model import QuantModel
from ..model.qdq import custom_op_sentence
from . import batching, runtime, sanity
from .instrument import LOCAL_PREFIX, Gates, anchored, constants_late, instrument, lowered
from .segments import Segments
from .workers import Workers, affordable, default_count

# Models with this many bytes of large weights run in low-memory mode by default.
LOW_MEMORY_BYTES = 64 * 2**20
# Keep float references in memory up to this many bytes; beyond, they are recomputed.
_REF_CACHE_BYTES = 512 * 2**20
# Samples whose input shapes a failing sample's are set against, spread over those that ran
_SHAPES_READ = 64
_END = object()  # an iterator's end, read with next()


MATRIX_OPS = ("MatMul", "Gemm")


def shares_weights(qmodel):
    """Whether ``memory="auto"`` runs ``qmodel`` in low-memory mode: with at least
    :data:`LOW_MEMORY_BYTES` of large weights, or when most of its large weights' bytes
    feed matrix products (MatMul, Gemm). Prepacking and layout transforms pay on
    convolutions (the PP-OCRv4 detector and recogniser, 4-10 MiB of mostly convolution
    weights, rank 2.1x and 2.8x slower without them), but a matrix product's prepacked
    copy per session costs more than it saves: MatMul stacks of 8 and 48 MiB (16 to 128
    tokens) built their engine and ranked as fast or faster in low-memory mode, at 105-194
    MiB peak instead of 180-884 MiB."""
    arrays = {**qmodel.shared, **qmodel.float_weights}
    total = sum(a.nbytes for a in arrays.values())
    if total >= LOW_MEMORY_BYTES:
        return True
    matrix = 0
    for c in qmodel.calibration.values():
        array = arrays.get(c.float_weight or c.input) if c.kind == "weight" else None
        if array is not None and any(qmodel.normal[n].op_type in MATRIX_OPS for n in c.consumers if n in qmodel.normal):
            matrix += array.nbytes
    return matrix * 2 > total


class Engine:
    """A calibrated model and its data, compiled once for every analysis.

    ``run(i, quantized)`` returns the chosen tensors of sample ``i`` with exactly the
    calibration nodes in ``quantized`` quantized and every other one bypassed.

    ``float_model``: the original float model, to recover float weights and folded Relu/Clip.
    ``data_num``: keep only the first N samples of the data (analyses take their own
    ``data_num`` too; give it in one place). ``optimization``: onnxruntime graph optimisation
    level (``disable``, ``basic``, ``extended``, ``all``). ``providers``: onnxruntime
    execution providers (default: CUDA when available, else CPU). ``check``: refuse a model
    whose bypassed form cannot be the float model. ``alternatives``: ``{node: QParams}``, a
    second fake-quant per node (16 bit, per channel) chosen per run. ``segments``: number of
    segments for model-output runs (default about sqrt(#calibration nodes), at most 16; 0 runs
    the whole gated model instead). ``custom_op_libraries``: paths of onnxruntime custom-op
    libraries the model's custom Q/DQ ops need (AMD Quark's BF16/BFP16, say). ``memory``:
    ``"low"`` shares the large weights among every session without prepacking them,
    ``"fast"`` lets each session prepack its own copy, ``"auto"`` (default) is low for models
    with at least :data:`LOW_MEMORY_BYTES` of large weights or mostly matrix-product weights
    (see :func:`shares_weights`). ``batch``: samples per run of
    model outputs in :meth:`batches` (``"auto"``: up to 8 where the model allows it and it
    measures faster, see :mod:`.batching`, and one in low-memory mode; 1: one at a time; N: N
    where the model allows it).
    ``plain_layout``: the whole-graph session without onnxruntime's NCHWc layout, as a config's
    pairs bypassed through gates computes (a re-quantized file checked against a simulation:
    what its settings keep in float is a constant there, which the layout would reorder).
    ``workers``: configs :meth:`run_many` runs at once (``"auto"``: one per core this
    process may use, at most 8, fewer where their tensors would not fit, one on a GPU or in
    low-memory mode; see :mod:`.workers`).
    """

    def __init__(self, model_or_file, calibrated_data=None, float_model=None, data_num=None,
                 optimization="all", providers=None, check=True, alternatives=None, segments=None,
                 custom_op_libraries=(), memory="auto", batch="auto", workers="auto", plain_layout=False):
        # the inputs as they were before this engine read them: a result kept between runs is
        # keyed by hashes read later, which must be of what the engine read
        self.versions = guard.versions(model_or_file, calibrated_data, float_model)
        if isinstance(model_or_file, QuantModel):
            self.qmodel = model_or_file
        else:
            self.qmodel = QuantModel(model_or_file, float_model=float_model)
        self.libraries = params.libraries(custom_op_libraries)
        if self.qmodel.custom_ops and not self.libraries:
            raise PTQError(custom_op_sentence(self.qmodel))
        self.float_model = float_model
        self.memory = memory = params.memory_mode(memory)
        self.batch, self._batching = params.auto_count(batch, "batch"), None
        self.shared = runtime.SharedWeights(self.qmodel.shared, low_memory=memory == "low" or (
            memory == "auto" and shares_weights(self.qmodel)))
        self.optimization = runtime.check_level(optimization)
        self.disabled = runtime.INLINE_DISABLED if params.flag(plain_layout, "plain_layout") else runtime.ALWAYS_DISABLED
        self.providers = runtime.asked_providers(providers) or runtime.default_providers()
        self.workers = workers = params.auto_count(workers, "workers")
        count = default_count(self.providers, self.shared.low_memory, runtime.all_cores()) \
            if workers == "auto" else workers
        self._workers = Workers(count, limit=runtime.spare_cores if workers == "auto" else None)
        self.data = load_data(calibrated_data, self.qmodel, data_num) if calibrated_data is not None else None
        self.calib_names = [c.name for c in self.qmodel.calibration.values() if c.bypassable]
        if alternatives is not None and not isinstance(alternatives, dict):
            raise PTQError(f"alternatives must map calibration nodes to their second fake-quant, got "
                           f"{type(alternatives).__name__}")
        alternatives = dict(alternatives or {})
        for name in alternatives:
            if name not in self.calib_names:
                raise unknown("node", name, self.calib_names)
        self.alternatives = alternatives
        self._gates = Gates.of(self.calib_names, alternatives)
        self._true, self._false = np.array(True), np.array(False)
        self._all_off = dict.fromkeys(self._gates.feed_names(), self._false)
        self._known = set(self._gates.flags) | set(self.qmodel.calibration)
        self._sessions = {}
        self._segments_count = None if segments is None else params.whole(segments, "segments", minimum=0)
        self._segments = None
        self._last_sample = None
        self._ran = set()  # indices of samples onnxruntime ran: what a failing sample's shapes are set against
        self._ref_cache, self._ref_bytes = {}, 0
        self.model_outputs = list(self.qmodel.output_names)
        self.probe_tensors = [t for n in self.qmodel.normal.values() for t in n.outputs
                              if t and self.qmodel.is_float_tensor(t)]
        self.warnings = list(self.qmodel.notes)
        self.rewrite = None
        self.folded = []  # pairs whose Relu/Clip the quantizer folded away (the float-equivalence check's)
        self._float_model = None  # the float model's own session, where it is the reference (true_float)
        # with a float model given, the weights it does not hold are the float-equivalence check's to name
        given_float = float_model is not None or getattr(self.qmodel, "alignment", None) is not None
        if not self.calib_names:
            self.warnings.append(
                "every calibration node is a lone DequantizeLinear of an already quantized weight, so "
                "nothing can be bypassed; " + ("the float model given holds none of those weights: pass the one "
                                               "this model was quantized from" if given_float else
                                               "pass the float model (float_model=...) to recover float weights"))
        elif not given_float and any(not c.bypassable and c.role != "bias" for c in self.qmodel.calibration.values()):
            self.warnings.append(
                "weights are stored already quantized (DequantizeLinear only) and no float model was "
                "given: weight analyses compare against the dequantized weight; pass the float model "
                "or quantize with extra_options={'AddQDQPairToWeight': True} for float weights")
        if params.flag(check, "check") and self.data is not None:
            self.check_float_equivalence()

    # -- what can be switched ------------------------------------------------------------
    def is_gated(self, name):
        """True when calibration node ``name`` can be quantized or bypassed per run."""
        return name in self._gates.flags

    def gated(self, names):
        """The names among ``names`` that can be switched, in the order given."""
        return [n for n in names if n in self._gates.flags]

    def with_alternatives(self, alternatives):
        """A second engine on the same model and data whose nodes in ``alternatives``
        (``{node: QParams}``) can also run their alternative fake-quant."""
        return self.on_data(self.data, alternatives)

    def on_data(self, data, alternatives=None):
        """A second engine on the same model, with every option of this one (its providers,
        custom-op libraries, memory mode...), whose samples are ``data`` (held-out data, say)."""
        return Engine(self.qmodel, data, float_model=self.float_model, optimization=self.optimization,
                      providers=self.providers, check=False, alternatives=alternatives,
                      segments=self._segments_count, custom_op_libraries=self.libraries, memory=self.memory,
                      workers=self.workers)

    @property
    def source(self):
        """The calibrated model's name in messages."""
        return self.qmodel.source

    # -- what it reads, and where an analysis may write ------------------------------------
    def inputs(self):
        """The files and folders this engine reads (:class:`~pytest_ptq.guard.Inputs`)."""
        inputs = guard.Inputs().add(self.qmodel.path, guard.MODEL_FILE)
        inputs.add(self.float_model, guard.FLOAT_MODEL)
        for lib in self.libraries:
            inputs.add(lib, "custom-op library")
        if self.data is not None:
            inputs.add(getattr(self.data, "path", None), "calibration data")
        return inputs

    @contextlib.contextmanager
    def writes(self, save_dir, label="save_dir", also=None, optional=False):
        """An analysis writing under ``save_dir`` on this engine (with ``optional``, None
        writes nowhere): the folder is checked before any work, and within the block nothing
        the engine reads (nor the :class:`~pytest_ptq.guard.Inputs` ``also``) can be
        written. Yields the folder as a Path (or None)."""
        inputs = self.inputs() | also
        skip = optional and save_dir is None
        out = None if skip else guard.output_path(save_dir, label, inputs, folder=True)
        with guard.protecting(inputs):
            yield out

    # -- compilation -----------------------------------------------------------------------
    def session(self, kind="main"):
        """The compiled session: ``main`` (model outputs), ``probe`` (every normal node's
        output too) or ``local`` (plus clones that measure local error). Built on first use."""
        if kind not in self._sessions:
            if kind == "main":
                model = self._instrument()
            elif kind == "probe":
                model = self._instrument(self.probe_tensors)
            elif kind == "local":
                model = self._instrument(self.probe_tensors, local=True)
            else:
                raise ValueError(kind)
            self._sessions[kind] = self._compile(model)
        return self._sessions[kind]

    def _instrument(self, extra_outputs=(), local=False):
        """The gated model; its large float weights join the shared ones."""
        found = {}
        model = instrument(self.qmodel, self._gates, extra_outputs, local, shared=found)
        self.shared.add(found)
        return model

    def _compile(self, model):
        inits = {i.name: i for i in model.graph.initializer}
        nodes = lowered(constants_late(model.graph, inits, self._gates))
        if self.shared.low_memory:
            nodes = anchored(nodes, inits, self._gates.feed_names())
        del model.graph.node[:]
        model.graph.node.extend(nodes)
        return runtime.make_session(model, self.optimization, self.providers, what=repr(self.source),
                                    libraries=self.libraries, shared=self.shared, disabled_optimizers=self.disabled)

    @property
    def segments(self):
        """The segmented runner for model outputs (None when ``segments=0``)."""
        if self._segments is None and self._segments_count != 0:
            seg = Segments(self._instrument(), self.qmodel, self._gates, self.optimization, self.providers,
                           self._segments_count, source=self.source, libraries=self.libraries, shared=self.shared)
            self._workers.count = count = affordable(self._workers.count, seg.boundary_bytes)
            if count > 1:  # the cores shared among the configs in flight (before any session compiles)
                seg.threads = max(1, runtime.cores() // count)
            self._segments = seg
        return self._segments

    @property
    def config_major(self):
        """Whether analyses should run every sample under a config before the next config:
        where a config compiles a form of its own (a 16-bit float graph's, see
        :meth:`.segments.Segments.touched`), that compiles it once, not once per sample."""
        return self.segments is not None and self.segments.per_config

    @property
    def concurrency(self):
        """How many configs :meth:`run_many` runs at once (decided with the segments)."""
        return self._workers.count if self.segments is not None else 1

    # -- running -----------------------------------------------------------------------
    def _check_feeds(self, feeds):
        """A feed dict given by the user (an evaluate function's ``run(feeds)``) holds every
        model input; extra entries are left unread."""
        if not isinstance(feeds, Mapping):
            raise PTQError(f"sample must be an index or a feed dict {{input name: array}}, got {shown(feeds)}")
        missing = [n for n in self.qmodel.input_names if n not in feeds]
        if missing:
            held = ", ".join(map(repr, list(feeds)[:4])) + (" ..." if len(feeds) > 4 else "")
            raise PTQError(f"the feeds lack model input {missing[0]!r} of {self.source!r} (they hold "
                           f"{held or 'nothing'}); give one array per model input: "
                           f"{', '.join(map(repr, self.qmodel.input_names))}")

    def feeds(self, sample, quantized=(), alternative=()):
        """Model inputs plus one flag per calibration node (True = quantized), and one per
        alternative (True = quantized the alternative way)."""
        quantized, alternative = set(quantized), set(alternative)
        unknown_names = quantized - self._known
        if unknown_names:
            raise unknown("node", sorted(unknown_names)[0], list(self.qmodel.calibration))
        # every flag off, then the few a config turns on: a config costs its own names, not
        # one dict entry per gate built in Python (0.25 ms a config with 3000 gates)
        feeds = {**sample, **self._all_off}
        for name in quantized:
            if name in self._gates.flags:
                feeds[self._gates.flags[name]] = self._true
        for name in alternative:
            if name in self._gates.alt_flags:
                feeds[self._gates.alt_flags[name]] = self._true
        return feeds

    def sample(self, i):
        """Sample ``i`` of the data (a tuple of indices: those samples stacked on axis 0); the
        last one is kept, since analyses loop samples outermost."""
        if self.data is None:
            raise PTQError("no calibration data was given; pass calibrated_data")
        if self._last_sample is None or self._last_sample[0] != i:
            value = batching.stack([self.data.sample(k) for k in i]) if isinstance(i, tuple) else self.data.sample(i)
            self._last_sample = (i, value)
        return self._last_sample[1]

    def batching(self, indices):
        """How :meth:`batches` groups samples (a :class:`~.batching.Batching`), decided on the
        first call with at least two samples and kept."""
        if self._batching is None:
            if self.batch == 1:
                return batching.Batching(1, "one sample per run, as asked")
            if self.batch == "auto" and self.shared.low_memory:
                # a stack holds that many samples' tensors (a ViT-S behind lone DQs: 224 MiB at one
                # sample per run, 274 / 302 / 396 MiB by 2 / 4 / 8, against 150-162 MiB for a plain
                # session), more than it saves: its ranking ran 1.2x faster by 2 (behind pairs,
                # +48 MiB), and memory-bound MatMul stacks' configs spend their time faulting
                # weights in, which a stack does not save. ``batch=N`` still stacks.
                return batching.Batching(1, "one sample per run in low-memory mode, so that memory holds one "
                                            "sample's tensors")
            if len(indices) < 2:
                return batching.Batching(1, "fewer than two samples")
            size = batching.MAX_GROUP if self.batch == "auto" else int(self.batch)
            choice = batching.decide(self, indices, size, grow=self.batch == "auto")
            if self.batch != "auto" and choice.size == 1 and choice.gain is not None:
                choice = batching.Batching(size, f"{size} samples per run, as asked ({choice.gain:.2f}x)", choice.gain)
            if choice.size == 1 and self.segments is not None:
                self.segments.drop_stacked()  # the trial's
            self._batching = choice
        return self._batching

    def batches(self, indices, tensors=None):
        """``indices`` in the groups that runs of ``tensors`` (default: the model outputs) take:
        ints, or tuples of samples run stacked (see :meth:`batching`; only model outputs run
        stacked); :func:`~.batching.split` cuts a group's outputs."""
        if any(t not in self.model_outputs for t in tensors or ()):
            return list(indices)
        return batching.groups(list(indices), self.batching(list(indices)).size)

    def release(self):
        """Drop every compiled session and cached tensor; they are rebuilt on next use. For a
        caller done with the engine for now (a test session whose tests of this model ran)."""
        self._workers.close()
        self._sessions.clear()
        self._segments = None
        self._ref_cache.clear()
        self._ref_bytes = 0
        self._last_sample = None
        runtime.trim_memory()

    def forget(self, key):
        """Drop the cached float reference of sample (or group) ``key``."""
        for k in [k for k in self._ref_cache if k[0] == key]:
            self._ref_bytes -= sum(v.nbytes for v in self._ref_cache.pop(k).values())
        if self._last_sample is not None and self._last_sample[0] == key:
            self._last_sample = None
        if self.segments is not None:
            self.segments.forget(key)

    def _config(self, quantized):
        if isinstance(quantized, str):  # "all", or one node's name
            return self.calib_names if quantized == "all" else [quantized]
        return quantized

    def run(self, sample, quantized=(), tensors=None, kind=None, alternative=()):
        """Tensors of one sample (an index, a feed dict, or a tuple of indices: those samples
        stacked, model outputs only) under a config.

        ``quantized``: the calibration node names quantized ("all" for every one, or one name).
        ``tensors``: the tensor names to return (default: the model outputs); each must be a
        model output or a float output of a normal node.
        ``kind``: the session, ``"main"`` (model outputs, through the segments where the model
        runs in segments) or ``"probe"`` (the whole graph, every node's float output exposed);
        default by ``tensors``.
        ``alternative``: quantized nodes that use their alternative parameters.
        """
        key = None
        if isinstance(sample, tuple):  # stacked samples: model outputs through the segments only
            key = sample
            sample = self.sample(key)
            if self.segments is None or not all(t in self.model_outputs for t in (tensors or self.model_outputs)):
                raise PTQError("stacked samples run model outputs only, through the segments")
        elif isinstance(sample, bool):
            raise PTQError(f"sample must be an index or a feed dict, got {sample}")
        elif isinstance(sample, (int, np.integer)):
            key = int(sample)
            count = 0 if self.data is None else len(self.data)
            if self.data is not None and not 0 <= key < count:  # -1 would run the last one unasked
                raise PTQError(f"sample {key} is out of range: the data {self.data.where!r} hold {count} sample(s), "
                               f"0 to {count - 1}")
            sample = self.sample(key)
        else:
            self._check_feeds(sample)
        quantized = self._config(quantized)
        tensors = list(tensors or self.model_outputs)
        if kind is None:
            kind = "main" if all(t in self.model_outputs for t in tensors) else "probe"
        if kind == "probe":
            missing = [t for t in tensors if t not in self.model_outputs and t not in self.probe_tensors]
            if missing:
                raise PTQError(f"tensor {missing[0]!r} is not a float output of a normal node of "
                               f"{self.source!r}; name a model output or a node output")
        with self.on_sample(key):
            if kind == "main" and self.segments is not None:
                return self._through_segments(key, sample, quantized, alternative, tensors)
            values = runtime.run(self.session(kind), tensors, self.feeds(sample, quantized, alternative), self.source)
        return dict(zip(tensors, values))

    def on_sample(self, i):
        """:func:`on_sample` of this engine's data: the samples it ran are what a failing
        one's shapes are set against."""
        return on_sample(self.data, i, self._ran)

    def _through_segments(self, key, sample, quantized, alternative, tensors):
        seg = self.segments
        return seg.run(key, sample, self.feeds({}, quantized, alternative), seg.touched(quantized), tensors)

    def run_many(self, i, configs, tensors=None):
        """:meth:`run` of sample ``i`` (an index, a stacked group or a feed dict) under each of
        ``configs`` (``[(quantized, alternative)]``), yielded in order. Model outputs run
        through the segments from one float prefix (a feed dict's too, computed once for the
        call), up to :attr:`concurrency` configs at once (see :mod:`.workers`); other tensors
        one config at a time. Stopping the loop early stops the runs."""
        tensors = list(tensors or self.model_outputs)
        if self.segments is None or any(t not in self.model_outputs for t in tensors):
            for quantized, alternative in configs:
                yield self.run(i, quantized, tensors, alternative=alternative)
            return
        feeds = isinstance(i, dict)
        key = object() if feeds else i if isinstance(i, tuple) else int(i)  # a feed dict's: this call's
        sample = i if feeds else self.sample(key)
        seg = self.segments
        configs = [(self._config(q), a) for q, a in configs]
        # the float prefix every config reads, computed once, as far as they ask, and what no
        # config left reads is dropped (configs come in graph order: one or two boundaries held)
        try:
            with self.on_sample(key):
                seg.prefix(key, sample).expect(seg.start(seg.touched(q)) for q, _ in configs)
                yield from self._workers.map(lambda qa: self._through_segments(key, sample, qa[0], qa[1], tensors),
                                             configs)
        finally:
            if feeds:
                seg.forget(key)

    def tensors(self, sample, quantized=(), names=()):
        """Any tensors of one sample under a config: model inputs from the sample, the rest
        from a session that exposes them, compiled on first use and kept: the probe session
        (every normal node's output) where it is compiled already, else one exposing exactly
        these, however many, without gates where the config quantizes whole groups or
        nothing (see :meth:`.segments.Segments.exposing`). The probe session cannot reuse the
        buffer of any tensor it exposes, so it holds a whole sample's activations (measured:
        243 MiB on the PP-OCRv4 recogniser for the float-equivalence check's few tensors;
        450 MiB on a ViT-S for its 37, which a session exposing just them holds in 30 MiB)."""
        with self.on_sample(sample):
            return self._tensors(sample, quantized, names)

    def _tensors(self, sample, quantized, names):
        index = sample
        if isinstance(sample, (int, np.integer)):
            sample = self.sample(int(sample))
        out = {t: sample[t] for t in names if t in sample}
        rest = [t for t in names if t not in out]
        if not rest:
            return out
        if isinstance(index, (int, np.integer)) and all(t in self.model_outputs for t in rest):
            # model outputs alone run as any config's do: through the segments, one at a time
            # in low-memory mode, whose pager keeps each under its ceiling before it starts (a
            # whole-graph run faults its weights in faster than the pager's looks, and set the
            # peak of a 192 MiB MatMul stack behind lone DQs: 150-197 MiB, 134-137 in its ranking)
            out.update(self.run(int(index), quantized, rest))
            return out
        known = set(self.probe_tensors) | set(self.model_outputs)
        if all(t in known for t in rest) and "probe" in self._sessions:
            out.update(self.run(sample, quantized, rest, kind="probe"))
            return out
        form = self.segments.fixed_form(self._config(quantized)) if self.segments is not None else None
        if form is not None and all(t in known for t in rest):
            out.update(self.segments.exposing(sample, form, rest))
            return out
        key = self._exposing(rest)
        if key not in self._sessions:
            self._sessions[key] = self._compile(self._instrument(list(key[1])))
        values = runtime.run(self._sessions[key], rest, self.feeds(sample, self._config(quantized)), self.source)
        out.update(zip(rest, values))
        return out

    def _exposing(self, names):
        return ("extra", tuple(sorted(t for t in names if t not in self.qmodel.input_names)))

    def forget_tensors(self, names):
        """Drop the session :meth:`tensors` compiled to expose exactly ``names`` (after a
        read made once)."""
        self._sessions.pop(self._exposing(names), None)
        if self._segments is not None:
            self._segments.forget_exposing(self._exposing(names)[1])

    def forget_config(self, quantized):
        """Drop the whole-graph session of a config that quantizes whole groups (``"all"``,
        say; see :meth:`.segments.Segments.fixed_form`) after runs made once, such as the
        float-equivalence check's; other configs' sessions serve every analysis and stay."""
        form = self._segments.fixed_form(self._config(quantized)) if self._segments is not None else None
        if form:
            self._segments.forget_whole(form)

    def reference(self, i, tensors=None):
        """Float (all bypassed) values of sample ``i``; model outputs are cached per sample."""
        tensors = list(tensors or self.model_outputs)
        key = (i, tuple(tensors))
        if key in self._ref_cache:
            return self._ref_cache[key]
        values = self.run(i, (), tensors)
        size = sum(v.nbytes for v in values.values())
        if self._ref_bytes + size <= _REF_CACHE_BYTES:
            self._ref_cache[key] = values
            self._ref_bytes += size
        return values

    def local(self, i):
        """(float values, locally quantized values) of every normal node output of sample i.

        The second dict holds, per normal node fed by calibration nodes, its output when its
        own inputs are quantized from their float values and nothing upstream is, and, for one
        owning pairs on model outputs (its inputs float or not), those outputs through its own
        pairs (see
        :func:`.instrument.local_clones`).
        """
        sess = self.session("local")
        names = [o.name for o in sess.get_outputs()]
        with self.on_sample(i):
            values = dict(zip(names, runtime.run(sess, names, self.feeds(self.sample(i)), self.source)))
        local = {k[len(LOCAL_PREFIX):]: v for k, v in values.items() if k.startswith(LOCAL_PREFIX)}
        return values, local

    def probe_parts(self, tensors):
        """How many parts :meth:`probes` yields per sample for ``tensors``."""
        if not tensors:
            return 0
        seg = self.segments
        return len(seg.walk_plan(tensors)[0]) if seg is not None and seg.walkable(tensors) else 1

    def probes(self, samples, configs, tensors, local=False):
        """``tensors`` (float outputs of normal nodes, model outputs) of each of ``samples``
        (indices or feed dicts), float and under each of ``configs`` (lists of quantized
        calibration node names). Yields ``(sample, parts)`` per sample, ``parts`` iterating
        :meth:`probe_parts` triples ``(float, local values, outputs)``: ``{tensor: value}``
        of the part's tensors run float; with ``local`` (indices only), each one's local
        value where calibration nodes feed its node (inputs quantized from float values;
        else empty); and an iterator of the same tensors under each config, computed as it
        is read. Parts are segments run one after another, each exposing only its tensors
        (see :meth:`.segments.Segments.walk`), where they give what the whole graph gives;
        else one part from a session exposing all of them; no part without ``tensors``. Read
        each sample's parts before the next sample; the caller may clear the dicts it is done
        with."""
        if not tensors:  # nothing to read: no run
            yield from ((i, iter(())) for i in samples)
            return
        seg = self.segments
        if seg is not None and seg.walkable(tensors):
            forms = [(seg.touched(self._config(q)), self.feeds({}, self._config(q))) for q in configs]
            samples = iter(samples)
            i = next(samples, None)
            try:
                while i is not None:  # one sample ahead: the last one's parts go once run
                    after = next(samples, None)
                    parts = seg.walk(i if isinstance(i, dict) else self.sample(i), forms, tensors, local,
                                     last=after is None)
                    yield i, ((ref, loc, self._reading(i, outs)) for ref, loc, outs in self._reading(i, parts))
                    i = after
            finally:
                seg.forget_walk()
            return
        for i in samples:
            yield i, self._probed(i, configs, tensors, local)

    def _reading(self, i, items):
        """``items``, an iterator that runs sample ``i`` as it is read, under :meth:`on_sample`:
        the walk's runs happen in its reader's loop, outside any call of the engine's."""
        items = iter(items)
        while True:
            with self.on_sample(i):
                item = next(items, _END)
            if item is _END:
                return
            yield item

    def _probed(self, i, configs, tensors, local):
        """:meth:`probes`' one part of sample ``i``, from sessions exposing every tensor: the
        gated probe session's, or, where configs get forms of their own (16-bit float graphs,
        see :attr:`config_major`), the whole graph in each config's form, float included
        (measured on Model Optimizer's fp16 conventions: the gated session's partial configs
        1.5e-4 and 6e-4 from onnxruntime running the file with only those pairs, the forms 0)."""
        ref, loc = self.local(i) if local else (None, {})
        loc = {t: loc[t] for t in tensors if t in loc}
        if self.config_major:
            seg, sample = self.segments, i if isinstance(i, dict) else self.sample(i)
            ref = seg.exposing(sample, frozenset(), tensors)
            outs = (seg.exposing(sample, seg.exact_form(self._config(q)), tensors) for q in configs)
        else:
            ref = ref if local else self.run(i, (), tensors, kind="probe")
            outs = (self.run(i, q, tensors, kind="probe") for q in configs)
        yield {t: ref[t] for t in tensors}, loc, outs

    def true_float(self, sample, tensors=None):
        """Model outputs ``tensors`` (default all) of the float model on ``sample`` (an index or
        a feed dict): the bypassed graph's, which are the float model's, but where the quantizer
        rewrote the graph beyond Q/DQ (``rewrite``, found by the float-equivalence check) the
        float model's own, from its session (kept). What a contract compares the quantized
        model with: against the bypassed graph, a model whose rewrite broke it could pass."""
        tensors = list(tensors or self.model_outputs)
        if self.rewrite is None or self.float_model is None:
            if isinstance(sample, (int, np.integer)):
                return self.reference(int(sample), tensors)
            return self.run(sample, (), tensors)
        if self._float_model is None:
            self._float_model = sanity.FloatModel(self)
        feeds = self.sample(int(sample)) if isinstance(sample, (int, np.integer)) else sample
        with self.on_sample(sample):
            values = self._float_model.outputs(feeds)
        missing = [t for t in tensors if t not in values]  # an output the float model names otherwise
        if missing:
            values.update(self.run(sample, (), missing))
        return {t: values[t] for t in tensors}

    # -- sanity --------------------------------------------------------------------------
    def float_equivalence(self):
        """The evidence :meth:`check_float_equivalence` decides on (a :class:`.sanity.Equivalence`);
        raises where it refuses the model. Keeps nothing."""
        return sanity.check(self)

    def check_float_equivalence(self, known=None):
        """Refuse a model whose bypassed form cannot be the float model, on evidence from the
        data (see :mod:`.sanity`); keep its warnings and any rewrite by the quantizer
        (``self.rewrite``). ``known``: :meth:`float_equivalence` of the same model, data and
        versions (kept from an earlier run), taken instead of computing it."""
        result = known if known is not None else self.float_equivalence()
        self.warnings += result.warnings
        self.rewrite = result.rewrite
        self.folded = sorted(result.suspects)
        return result


@contextlib.contextmanager
def on_sample(data, i, ran):
    """Runs of sample ``i`` of ``data`` (an index; anything else: nothing is done): an
    onnxruntime failure names the sample, and one that blames the model says how the
    sample's input shapes differ from those of the samples in ``ran`` (indices), where they
    do (see :func:`_failed_on`); a run that ends well adds the sample to ``ran``."""
    index = isinstance(i, (int, np.integer)) and not isinstance(i, bool)
    try:
        yield
    except RunFailed as exc:  # a sentence naming the sample already is no RunFailed: left as it is
        if not index or not hasattr(data, "describe"):
            raise
        raise _failed_on(exc, data, int(i), ran) from None
    if index:
        ran.add(int(i))


def _failed_on(exc, data, i, ran):
    """The PTQError for ``exc``, onnxruntime failing on sample ``i`` of ``data``. A model
    whose declared input leaves an axis open may still fix it inside (a Flatten feeding a
    Gemm sized for one image size): onnxruntime then blames a node, and only the sample's
    shape, beside those of the samples that ran (or, before any ran, the others'), tells
    that the sample is what the model cannot take."""
    named = PTQError(f"{exc} (on {data.role} sample {i}: {data.describe(i)})")
    if not isinstance(exc, ModelFailed):
        return named
    mine = dict(data.fed_shapes(i))
    ran = [j for j in sorted(ran) if j != i]
    others = ran or [j for j in range(len(data)) if j != i]
    # a spread of them: a failure must not read the headers of a whole large data set
    seen = [dict(data.fed_shapes(others[k])) for k in sanity.spread(len(others), _SHAPES_READ)]
    if not seen or mine in seen:
        return named
    names = ([n for n in mine if all(s[n] != mine[n] for s in seen)] or
             [n for n in mine if any(s[n] != mine[n] for s in seen)])
    theirs = [" or ".join(dict.fromkeys(str(list(s[n])) for s in seen)) for n in names]
    whose = " and ".join(f"input {n!r} is {list(mine[n])}" for n in names)
    verb = "are" if len(names) == 1 else "have"
    those = (f"the samples that run {verb} " if ran else f"the other samples {verb} ") + " and ".join(theirs)
    free = "are not free inside it" if ran else "may not be free inside it"
    return PTQError(f"onnxruntime fails to run {exc.source!r} on {data.role} sample {i} ({data.describe(i)}), "
                    f"whose {whose} where {those}: the model's open axes {free} ({exc.quoted}); resize the sample "
                    "or fix the model's declared shape")


def engine_for(model_or_file, calibrated_data=None, float_model=None):
    """The :class:`Engine` an analysis works on: ``model_or_file`` itself when it is one (its
    data attached when it has none), else a new one compiled from a path or ModelProto."""
    if isinstance(model_or_file, Engine):
        engine = model_or_file
        if calibrated_data is not None and engine.data is None:
            engine.data = load_data(calibrated_data, engine.qmodel)
        elif calibrated_data is not None and not _holds(engine.data, calibrated_data):
            raise PTQError(f"the Engine given analyses its own calibration data ({engine.data.where!r}), not the "
                           f"calibrated_data passed with it; pass the model file with that data, or build "
                           f"Engine(model, data) for it")
        if float_model is not None and not _same_file(float_model, engine.float_model):
            raise PTQError(f"the Engine given compares against its own float model "
                           f"({'none' if engine.float_model is None else repr(str(engine.float_model))}), not the "
                           f"float_model passed with it; pass the model file with that float model, or build "
                           f"Engine(model, data, float_model=...) for it")
        return engine
    return Engine(model_or_file, calibrated_data, float_model=float_model)


def _same_file(given, held):
    """Whether ``given`` (a path, a ModelProto, data) names what ``held`` is."""
    if given is held:
        return True
    try:
        return held is not None and Path(given).resolve() == Path(held).resolve()
    except TypeError:  # a ModelProto or a mapping: only the very object is known to be the same
        return False


def _holds(data, given):
    """Whether calibration ``data`` is ``given`` (the object, its file or folder, or a mapping
    of the same samples)."""
    if given is data or (data.path is not None and _same_file(given, data.path)):
        return True
    if not isinstance(given, (Mapping, list, tuple)) or data.path is not None:
        return False
    try:
        other = load_data(given)
    except PTQError:
        return False
    return len(other) == len(data) and set(other.names) == set(data.names) and all(
        np.array_equal(np.ravel(other.sample(i)[k]), np.ravel(data.sample(i)[k]))
        for i in range(len(data)) for k in data.names)

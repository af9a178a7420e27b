"""One model under test: its compiled engine and every result computed on it, cached.

The plugin keeps one :class:`Analysis` per (model, data, float model, data_num) for the
session (per xdist worker, each has its own): the model is compiled once, the float
reference outputs of each sample are computed once, and every test on that model shares
them with the sensitivities and curves computed so far.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import NamedTuple

from . import guard, params
from .cache import ResultCache, arrays_digest, file_hash, model_files, model_hash
from .curves import configs_from, get_acc_error
from .data import load_data
from .engine import Engine
from .errors import InputRefused, PTQError, closest, raised_by_user
from .metrics import Pooled, by_output, get_metric, get_metrics
from .outputs import blind_warnings, far_from_zero, parse_outputs
from .outputs import thresholds as output_thresholds
from .progress import Progress
from .sensitivity import get_sensitivity_of_nodes
from .stages import simulation_warnings
from .tables import listed


class UnknownOutput(KeyError):
    """An evaluation function asked for an output the model does not have."""

    def __str__(self):  # the sentence, not KeyError's quoted repr of it
        return str(self.args[0])


class ModelOutputs(dict):
    """``{output name: array}`` handed to an evaluation function; a name the model lacks
    raises :class:`UnknownOutput` naming the ones it has (a bare KeyError named only the typo)."""

    def __init__(self, values, model):
        super().__init__(values)
        self.model = model

    def __missing__(self, key):
        near = closest(str(key), list(self))
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise UnknownOutput(f"{key!r} is not an output of {str(self.model)!r}{hint}; its outputs are {listed(list(self))}")


@dataclasses.dataclass(frozen=True)
class AnalysisKey:
    """What makes two analyses the same: absolute paths and the sample limit."""

    model: str
    data: str
    float_model: str | None = None
    data_num: int | None = None
    custom_op_library: str | None = None

    @property
    def id(self):
        """A string naming the key, equal across xdist workers."""
        parts = [self.model, self.data, self.float_model, self.data_num]
        if self.custom_op_library:
            parts.append(self.custom_op_library)
        return "|".join(str(v) for v in parts)


@dataclasses.dataclass
class OutputMetrics:
    """``values[output][metric]`` pooled over ``samples`` samples (quantized vs float); None
    for an output in ``empty`` (``{output: shape}``), which held no values on any sample."""

    values: dict
    samples: int
    data: str
    empty: dict = dataclasses.field(default_factory=dict)


class TaskScores(NamedTuple):
    """What :meth:`Analysis.accuracy` measured: the function's two scores, and the outputs
    the quantized pass handed it that held NaN or Inf (a NaN score beside none is the
    metric's own, a 0/0, not the model's)."""

    float: float
    quantized: float
    nonfinite: tuple = ()


class Analysis:
    """The cached results of one model; build it through :meth:`PTQSession.analysis`."""

    def __init__(self, key, root=".", cache_dir=None, memory="auto", workers="auto", progress=None,
                 cache_read_only=False):
        self.key = key
        # the longest steps draw progress there (a text stream), e.g. the plugin's terminal
        self.progress = progress
        # how the engine spends memory and cores; not keyed: results agree to float rounding
        self.resources = {"memory": memory, "workers": workers}
        self.root = Path(root)
        self.label = self.relative(key.model)
        self._engine = None
        # what the summary and report read of a released engine: (its warnings, its output names)
        self._released = None
        self._cache = {}
        # the metrics results were asked in, the default's first: the outputs each cannot see
        # are warned of (kl on a single logit ties every node at 0)
        self._metrics = {"cosine-similarity": None}
        # results on disk (cache.py), keyed by every file the engine reads
        self.store = None if cache_dir is None else ResultCache(
            cache_dir, self._files, (("data_num", key.data_num),), option="--ptq-cache-dir", shown=self.relative,
            read=lambda: self._read, read_only=cache_read_only)
        self._read = None  # the engine's inputs before it read them (Engine.versions)

    def _files(self):
        """The files behind the engine's results, by role (the models' external data too)."""
        files = {guard.MODEL_FILE: self.key.model, "calibration data": self.key.data,
                 guard.FLOAT_MODEL: self.key.float_model, "custom-op library": self.key.custom_op_library}
        files.update({f"model data {i}": p for i, p in enumerate(model_files(self.key.model)[1:])})
        files.update({f"float model data {i}": p for i, p in enumerate(model_files(self.key.float_model)[1:])})
        return files

    def inputs(self, *more):
        """What this analysis reads (model, data, float model) and the paths ``more`` (held-out
        data, say), as :class:`~pytest_ptq.guard.Inputs` for the output guard."""
        inputs = (guard.Inputs().add(self.key.model, guard.MODEL_FILE).add(self.key.data, "calibration data")
                  .add(self.key.float_model, guard.FLOAT_MODEL))
        for path in more:
            inputs.add(path, "held-out data")
        return inputs

    def relative(self, path):
        """``path`` as shown in messages: relative to the rootdir where it lies below it."""
        return relative(path, self.root) if _below(path, self.root) else Path(path).as_posix()

    @property
    def engine(self):
        """The compiled :class:`Engine` (built on first use). Its data are the first
        ``data_num`` calibration samples: the one place the key's ``data_num`` is applied, so
        every analysis below runs on all of the engine's samples."""
        if self._engine is None:
            engine = Engine(self.key.model, self.key.data, float_model=self.key.float_model,
                            data_num=self.key.data_num, check=False, **self.resources,
                            custom_op_libraries=[self.key.custom_op_library] if self.key.custom_op_library else ())
            self._read = engine.versions
            if engine.data is not None:  # the check reads only what the cache keys: kept too (a refusal is not)
                engine.check_float_equivalence(self.cached(("float equivalence",), engine.float_equivalence, files=()))
            self._engine = engine
        return self._engine

    def release(self):
        """Drop the engine: its sessions, parsed model, weights and their file mappings (results
        stay, and its warnings and output names for the summary); used again, it recompiles.
        The engine itself goes, not only its sessions: a kept one held ~10 MiB per finished
        600-node model, a descriptor per external weight, and a low-memory one the malloc setting
        made for it, which made the user's later tests in the process 18x slower."""
        if self._engine is not None:
            # they run the engine: before it goes
            self._released = (self.warnings, list(self._engine.model_outputs))
            self._engine.release()
            self._engine = None

    def _run_warnings(self):
        """The sentences of the checks that run the model, computed once: the simulation check
        (the file run as given, on onnxruntime's integer kernels) and the outputs a metric
        results were asked in cannot see errors in (:func:`~pytest_ptq.outputs.blind_warnings`);
        kept on disk with the results."""
        told = self.cached(("run warnings",), lambda: simulation_warnings(self._engine), files=())
        # the outputs are scanned once; cosine, sqnr and mre are blind to the same offset, said once
        far = self.cached(("far from zero",), lambda: far_from_zero(self._engine), files=())
        for metric in list(self._metrics):
            told = told + self.cached(("blind warnings", metric),
                                      lambda m=metric: blind_warnings(self._engine, metric=m, found=far), files=())
        return list(dict.fromkeys(told))

    def _judged_by(self, metric):
        """The canonical name of ``metric``, noted as one whose blind outputs are warned of."""
        name = get_metric(metric).name
        self._metrics[name] = None
        return name

    @property
    def qmodel(self):
        return self.engine.qmodel

    @property
    def output_names(self):
        """The model's output names; a released engine's kept ones: reading them never
        recompiles the model."""
        if self._engine is None and self._released is not None:
            return list(self._released[1])
        return list(self.engine.model_outputs)

    @property
    def warnings(self):
        """The engine's warnings (folded activations, rewritten graphs, a file that runs
        otherwise than its simulation on onnxruntime's integer kernels, an output too far from
        zero for a cosine, ...); none before it is built, those it had when released after:
        reading them never compiles the model."""
        if self._engine is None:
            return [] if self._released is None else list(self._released[0])
        return list(self._engine.warnings) + self._run_warnings()

    @property
    def data(self):
        """The calibration samples the checks use (the engine's)."""
        return self.engine.data

    @property
    def samples(self):
        """Number of calibration samples analysed."""
        return len(self.data)

    def cached(self, key, compute, files=None):
        """``compute()`` once per ``key`` for the session (results shared by every test). With
        ``files`` (the files it reads beyond the model's own, possibly none) the result is
        also kept on disk when the analysis has a cache folder."""
        if key not in self._cache:
            if self.store is None or files is None:
                self._cache[key] = compute()
            else:
                self._cache[key] = self.store.get(key, compute, files)
        return self._cache[key]

    def dataset(self, holdout=None):
        """The calibration data, or held-out data validated against the model."""
        if holdout is None:
            return self.data
        return self.cached(("holdout", str(holdout)), lambda: load_data(holdout, self.qmodel, role="held-out",
                                                                     calibration=self.data))

    def output_metrics(self, outputs=None, metrics=("cosine-similarity",), holdout=None):
        """Metrics of the fully quantized model against the float one, per output.

        ``outputs``: None (every float model output), or names and slices like
        ``"cls=prob[:, 4:]"``. Each value pools every sample (the metric of the samples
        concatenated).
        """
        metric_objs = get_metrics(list(metrics))
        for m in metric_objs:
            self._judged_by(m.name)
        # the default's parts follow from the model and data, which the cache keys already:
        # resolved when computed, so that a cached result needs no engine
        specs = None if outputs is None else parse_outputs(list(outputs), self.qmodel)
        key = ("outputs", None if specs is None else tuple((s.name, s.tensor, repr(s.index)) for s in specs),
               tuple(m.name for m in metric_objs), str(holdout))
        return self.cached(key, lambda: self._output_metrics(specs, metric_objs, holdout), files=(holdout,))

    def _output_metrics(self, specs, metric_objs, holdout):
        engine = self.engine
        specs = parse_outputs(None, engine) if specs is None else specs
        tensors = list(dict.fromkeys(s.tensor for s in specs))
        pools = [Pooled(m, specs) for m in metric_objs]
        data = self.dataset(holdout)
        with Progress(len(data), "outputs, fully quantized vs float", enabled=self.progress) as bar:
            for i in range(len(data)):
                # against the float model itself, not the bypassed graph where a rewrite broke it
                if holdout is None:
                    ref = engine.true_float(i, tensors)  # cached and shared with sensitivity, as a rule
                    out = engine.run(i, "all", tensors)
                else:
                    feeds = data.sample(i)
                    ref, out = engine.true_float(feeds, tensors), engine.run(feeds, "all", tensors)
                for pool in pools:
                    pool.add(ref, out)
                bar.advance()
        return OutputMetrics(values=by_output(pools), samples=len(data), data=str(holdout or self.key.data),
                             empty=pools[0].empty() if pools else {})

    def sensitivity(self, node_type="node", metric="cosine-similarity", outputs=None):
        """:class:`Sensitivity` of every node of ``node_type``, most sensitive first."""
        name = self._judged_by(metric)
        key = ("sensitivity", node_type, name, None if outputs is None else tuple(outputs))
        return self.cached(key, lambda: get_sensitivity_of_nodes(
            self.engine, metrics=[name], node_type=node_type,
            output_node=None if outputs is None else list(outputs), progress=self.progress), files=())

    def verdict(self, holdout=None, metric="cosine-similarity", outputs=None):
        """:class:`~pytest_ptq.verdict.Verdict`: weights only, activations only and everything
        quantized on every calibration sample the checks use (the first ``data_num``: samples
        a contract leaves out are not its data) and on ``holdout`` when given; the rankings'
        samples are compared with the whole set. ``outputs``: output specs judged (default:
        the model's outputs)."""
        from .verdict import three_configs

        name = self._judged_by(metric)
        outputs = None if outputs is None else tuple(outputs)

        def compute():
            specs = parse_outputs(None if outputs is None else list(outputs), self.engine)
            return three_configs(self.engine, specs, name, holdout, ranking_samples=self.samples)

        key = ("verdict", None if holdout is None else str(holdout), name) + ((outputs,) if outputs else ())
        return self.cached(key, compute, files=(holdout,))

    def diagnosis(self, node_type="node", metric="cosine-similarity", holdout=None, top=10, outputs=None):
        """:class:`~pytest_ptq.diagnosis.Diagnosis`: why the model loses accuracy, from the
        :meth:`verdict` on ``holdout`` (the data a contract judged on) and the ``node_type``
        ranking: each top node's kind, the reading behind it, and the fix in the producer's
        terms; ``outputs``: the output specs judged, where a contract failed on a slice (default:
        the model's outputs). A weight (activation) ranking where the verdict blames activations
        (weights) ranks the kind it blames instead, and says so. Costs one sweep of the top
        nodes' statistics; no remedy search."""
        from .diagnosis import diagnose

        name = self._judged_by(metric)
        outputs = None if not outputs else tuple(outputs)
        key = ("diagnosis", node_type, name, None if holdout is None else str(holdout), top) + \
            ((outputs,) if outputs else ())

        def compute():
            verdict = self.verdict(holdout, name, outputs)
            ranked = node_type
            if {node_type, verdict.source} == {"weight", "activation"}:
                ranked = verdict.source  # the other kind's nodes would point at a fix that recovers nothing
            return diagnose(self.engine, self.sensitivity(ranked, name, outputs), verdict, top,
                            None if outputs is None else list(outputs), asked=node_type)

        # kept on disk: its sweep of the top nodes' statistics took 9 s of an unchanged failing
        # contract's rerun whose checks all read their results back
        return self.cached(key, compute, files=(holdout,))

    def curves(self, metric="cosine-similarity"):
        """Cumulative error curves: only weights, only activations, everything quantized."""
        name = self._judged_by(metric)

        def compute():
            engine = self.engine
            configs = {label: names for label, names in configs_from(engine, ["weight", "activation"]).items()
                       if names}
            configs["all quantized"] = list(engine.calib_names)
            return get_acc_error(engine, configs, name, progress=self.progress)

        return self.cached(("curves", name), compute, files=())

    def data_check(self, holdout=None, metric=None, threshold=None, threshold_from=None, outputs=None):
        """:class:`~pytest_ptq.datacheck.DataReport` of the calibration data (the first
        ``data_num`` samples), and of a held-out set against them when ``holdout`` is given,
        the quantized model judged there by ``metric`` against ``threshold`` (see
        :func:`~pytest_ptq.datacheck.check_data`; ``threshold_from`` says where it comes from; ``outputs``
        the outputs or slices judged, default every output)."""
        from .datacheck import check_data

        if holdout is None:  # they judge the held-out comparison alone
            metric = threshold = threshold_from = outputs = None
        key = ("data_check", None if holdout is None else str(holdout)) + (
            () if holdout is None else (metric, threshold, threshold_from, outputs and tuple(outputs)))
        return self.cached(key, lambda: check_data(self.engine, heldout=holdout, data_num=self.key.data_num,
                                                   metric=metric, threshold=threshold, threshold_from=threshold_from,
                                                   outputs=outputs), files=(holdout,))

    def stages(self, float_model=None):
        """:class:`~pytest_ptq.stages.StageReport`: the float model under graph optimisations,
        the fake-quant and the integer-kernel model against the float model, on the calibration
        data. ``float_model`` defaults to the analysis' own float model."""
        from .stages import localize_stages

        float_model = float_model or self.key.float_model
        if float_model is None:
            raise PTQError(f"comparing the stages of {self.label} needs the float model it came from; pass "
                           "float_model=..., the marker's float_model= or --ptq-float-model")
        float_model = str(Path(float_model).resolve())
        return self.cached(("stages", float_model), lambda: localize_stages(float_model, self.engine, self.data),
                           files=model_files(float_model))

    def suggest(self, target=0.99, remedy="float", metric="cosine-similarity", outputs=None, budget=None,
                candidates=None, holdout=None, evaluate=None, min_ratio=None, costs=None, search="refine"):
        """:class:`~pytest_ptq.remedy.Remedy`: the cheapest set of nodes to keep in float, raise to
        16 bit or quantize per channel (``remedy="mixed"``: a kind per node at ``costs``) so that
        ``metric`` meets ``target``, or the task score of ``evaluate(run, data)`` meets ``target``
        or ``min_ratio`` x float. Chosen on the calibration samples, accepted on ``holdout`` data
        (else on calibration samples the search did not see); measured by re-quantizing when
        the analysis has a float model. Kept for the report."""
        from .remedy import suggest_remedy
        from .remedy.producer_check import producer_python

        name = self._judged_by(metric)
        # a mapping is per output, as the output checks take it; read here for the key too, so
        # that two spellings of one mapping ('default' / '', keys in another order) share one search
        target = (output_thresholds(target, self) if isinstance(target, dict) else
                  None if target is None else params.number(target, "target"))
        target_key = _frozen(target) if isinstance(target, dict) else target
        # the producer's Python, where named, re-quantizes the remedy too: a result without its check is another
        key = ("remedy", remedy, name, target_key, _frozen(outputs), budget, _frozen(candidates),
               None if holdout is None else str(holdout), evaluate, min_ratio, _frozen(costs), search,
               producer_python(self.qmodel.made_by.key))
        return self.cached(key, lambda: suggest_remedy(
            self.engine, target=target, metric=name, remedy=remedy,
            output_node=None if outputs is None else outputs, budget=budget, candidates=candidates,
            float_model=self.key.float_model, progress=False,
            heldout=None if holdout is None else self.dataset(holdout), evaluate=evaluate, min_ratio=min_ratio,
            costs=costs, search=search), files=(holdout,))

    def computed(self, kind):
        """The results of ``kind`` (``"data_check"``, ``"stages"``, ``"remedy"``, ...) that tests
        have computed so far, in the order computed; computes nothing."""
        return [value for key, value in self._cache.items() if key[0] == kind]

    def accuracy(self, evaluate, holdout=None):
        """:class:`TaskScores` of a user evaluation function: ``(float score, quantized
        score, quantized outputs that held NaN or Inf)``.

        ``evaluate(run, data) -> float`` (higher is better) is called twice: ``run(feeds)``
        maps ``{input name: array}`` to ``{output name: array}`` through the float model,
        then through the quantized one; ``data`` is the sample set (``len(data)``,
        ``data.sample(i)``, iteration yields feed dicts in order).
        """
        __tracebackhide__ = True  # an evaluation function that raises shows its own frames
        engine = self.engine
        data = self.dataset(holdout)

        nonfinite = {}  # output names, in the order met

        def through(config):
            # the function itself always runs (its code is not keyed); the model's outputs for
            # the samples it feeds are kept on disk, keyed by the feeds' bytes
            def run(feeds):
                feeds = dict(feeds)
                # the float model itself (see Engine.true_float), or the quantized one
                compute = (lambda: engine.true_float(feeds)) if config == () else (lambda: engine.run(feeds, config))
                values = compute() if self.store is None else self.store.get(
                    ("outputs", config, arrays_digest(feeds)), compute)
                if config != ():
                    nonfinite.update(dict.fromkeys(k for k, v in values.items() if _nonfinite(v)))
                return ModelOutputs(values, engine.qmodel.source)
            return run

        scores = []
        for model, run in (("float", through(())), ("quantized", through("all"))):
            try:
                score = evaluate(run, data)
            except InputRefused as exc:  # feeds the function built: its line, not the data, is at fault
                raise raised_by_user(f"the evaluation function {_name(evaluate)}", exc) from None
            except PTQError:
                raise
            except Exception as exc:
                # a note, not a sentence of ours: pytest prints it under the message, and the
                # user's frames and exception stay as raised
                after = f", after scoring the float model {scores[0]!r}" if scores else ""
                exc.add_note(f"the evaluation function {_name(evaluate)} raised it on the {model} model{after}")
                raise
            scores.append(params.task_score(score, _name(evaluate)))
        return TaskScores(*scores, tuple(nonfinite))

    def fingerprint(self):
        """Hashes of the model, data and float model, for baselines (not compared exactly)."""
        def compute():
            import onnx
            import onnxruntime

            from . import __version__

            digest = file_hash if self.store is None else self.store.hash_of
            fp = {"model_sha256": model_hash(self.key.model, digest), "data_sha256": digest(self.key.data),
                  "samples": self.samples, "pytest_ptq": __version__, "onnxruntime": onnxruntime.__version__,
                  "onnx": onnx.__version__}
            if self.key.float_model:
                fp["float_model_sha256"] = model_hash(self.key.float_model, digest)
            return fp

        return self.cached(("fingerprint",), compute)


def _frozen(value):
    """A hashable cache key part of a name, a list of names or a mapping."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict):
        return tuple(sorted(value.items()))
    return tuple(value)


def _nonfinite(value):
    import numpy as np

    value = np.asarray(value)
    return value.dtype.kind in "fc" and not np.isfinite(value).all()


def _name(fn):
    return getattr(fn, "__qualname__", None) or repr(fn)


def _below(path, root):
    try:
        Path(path).resolve().relative_to(Path(root).resolve())
        return True
    except ValueError:
        return False


def relative(path, start):
    """``path`` relative to ``start`` with forward slashes where possible, else absolute."""
    try:
        return Path(os.path.relpath(path, start)).as_posix()
    except ValueError:  # another drive on Windows
        return Path(path).as_posix()

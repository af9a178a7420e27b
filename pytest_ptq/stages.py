"""Stage localisation: at which step between the float model and the integer model the
outputs drift, on the same data (the seed's original / optimized / calibrated / quantized
model comparison).

Stages, each compared with the float model run without graph optimisations:

1. ``optimized-float``: the float model under onnxruntime's ORT_ENABLE_ALL optimisations;
2. ``fake-quant``: the calibrated QDQ model with Q/DQ kept as float arithmetic
   (``session.disable_quant_qdq=1``): the quantization as simulated;
3. ``integer``: the same QDQ model with default session options, where onnxruntime fuses
   Q/DQ into its integer kernels (QLinearConv, QLinearMatMul, ...).

A drop at stage 1 points at the export or a graph optimisation, at stage 2 at calibration
and quantization (find the nodes with sensitivity, fix them with ``suggest``), at stage 3
only at the integer kernels. ``kernel_gap`` compares stages 3 and 2 directly.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from .data import load_data
from .errors import PTQError
from .metrics import get_metrics
from .model import QuantModel, load_model
from .outputs import parse_outputs
from .progress import Progress
from .results import JsonResult
from .tables import format_table

STAGES = {
    "optimized-float": "float model, onnxruntime ORT_ENABLE_ALL",
    "fake-quant": "QDQ model, Q/DQ simulated in float (disable_quant_qdq=1)",
    "integer": "QDQ model on onnxruntime's integer kernels (default options)",
}
_ADVICE = {
    "optimized-float": ("the float model already changes under onnxruntime's graph optimisations: check the "
                        "export (opset, unsupported ops) before looking at quantization"),
    "fake-quant": ("the simulated quantization loses it: a calibration or quantization problem; rank the nodes "
                   "with get-sensitivity-of-nodes and fix them with suggest"),
    "integer": ("the simulation holds but onnxruntime's integer kernels do not: a kernel problem (int16 "
                "saturation of u8s8 kernels on CPUs without VNNI, an unsupported fusion); try reduce_range=True, "
                "per-channel weights, QInt8 activations or another execution provider"),
}


@dataclasses.dataclass
class StageReport(JsonResult):
    """Per stage ``{"stage", "description", "values": {metric: v}, "per_output": {output:
    {metric: v}}, "per_sample": {metric: [v]}}`` in pipeline order; ``values`` is the worst
    output, samples pooled. ``kernel_gap``: integer vs fake-quant, same shape.
    ``first_drop``: the first stage worse than ``threshold`` (None when all hold or no
    threshold applies). Truthy when no stage drops.
    """

    metrics: list
    outputs: list
    samples: int
    threshold: float | None
    stages: list
    kernel_gap: dict
    first_drop: str | None
    message: str
    float_model: str = ""
    calibrated_model: str = ""
    optimized_model: str | None = None

    def __bool__(self):
        return self.first_drop is None

    def value(self, stage, metric=None):
        metric = metric or self.metrics[0]
        for s in self.stages:
            if s["stage"] == stage:
                return s["values"][metric]
        raise KeyError(stage)

    def table(self):
        rows = [{"stage": s["stage"], **s["values"], "description": s["description"]} for s in self.stages]
        rows.append({"stage": "integer vs fake-quant", **self.kernel_gap["values"],
                     "description": "how far the integer kernels are from the simulation"})
        return format_table(rows, ["stage"] + self.metrics + ["description"])




def _session(model, level, fake_quant=False, providers=None, save_to=None):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    if fake_quant:
        so.add_session_config_entry("session.disable_quant_qdq", "1")
    if save_to is not None:
        so.optimized_model_filepath = str(save_to)
    so.log_severity_level = 3
    try:
        return ort.InferenceSession(model.SerializeToString(), so,
                                    providers=providers or ["CPUExecutionProvider"])
    except Exception as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise PTQError(f"onnxruntime cannot load the model for stage comparison ({msg}); check that it runs "
                       "in a plain onnxruntime session") from None


def localize_stages(float_model, calibrated_model, calibrated_data, metrics=("cosine-similarity",),
                    output_node=None, data_num=None, threshold=None, providers=None, save_dir=None,
                    progress=None):
    """Compare every stage's outputs with the float model's on the same samples.

    ``threshold`` applies to the first metric (default 0.99 for cosine similarity, none for
    other metrics, which then only report values). ``output_node``: model outputs or slices
    of them. With ``save_dir``, onnxruntime's optimised float model is written there.
    Returns a :class:`StageReport`.
    """
    metric_objs = get_metrics(metrics)
    first = metric_objs[0]
    if threshold is None and first.name == "cosine-similarity":
        threshold = 0.99
    fmodel, fpath = load_model(float_model, what="float model")
    qm = QuantModel(calibrated_model)
    qmodel = qm.model
    data = load_data(calibrated_data, qm, data_num)
    specs = parse_outputs(output_node, qm)
    float_outputs = {o.name for o in fmodel.graph.output}
    for s in specs:
        if s.tensor not in qm.output_names or s.tensor not in float_outputs:
            raise PTQError(f"output {s.tensor!r} is not an output of both the float and the calibrated model; "
                           f"stages compare model outputs (common: {sorted(float_outputs & set(qm.output_names))})")
    finputs = [i.name for i in fmodel.graph.input if i.name not in {x.name for x in fmodel.graph.initializer}]
    if sorted(finputs) != sorted(qm.input_names):
        raise PTQError(f"the float model's inputs {finputs} differ from the calibrated model's {qm.input_names}; "
                       "pass the float model the calibrated model was made from")
    optimized = None
    if save_dir is not None:
        Path(save_dir).mkdir(parents=True, exist_ok=True)
        optimized = Path(save_dir) / "optimized_float_model.onnx"
    sessions = {
        "reference": _session(fmodel, "ORT_DISABLE_ALL", providers=providers),
        "optimized-float": _session(fmodel, "ORT_ENABLE_ALL", providers=providers, save_to=optimized),
        "fake-quant": _session(qmodel, "ORT_ENABLE_ALL", fake_quant=True, providers=providers),
        "integer": _session(qmodel, "ORT_ENABLE_ALL", providers=providers),
    }
    tensors = list(dict.fromkeys(s.tensor for s in specs))
    labels = list(STAGES) + ["kernel-gap"]
    pooled = {k: {(s.name, m.name): m.new() for s in specs for m in metric_objs} for k in labels}
    per_sample = {k: {m.name: [] for m in metric_objs} for k in labels}
    indices = range(len(data))
    with Progress(len(data), "stages", enabled=bool(progress)) as bar:
        for i in indices:
            feeds = data.sample(i)
            outs = {k: dict(zip(tensors, sess.run(tensors, feeds))) for k, sess in sessions.items()}
            for k in labels:
                ref, test = (outs["fake-quant"], outs["integer"]) if k == "kernel-gap" else (outs["reference"], outs[k])
                for m in metric_objs:
                    vals = []
                    for s in specs:
                        r, t = s.take(ref[s.tensor]), s.take(test[s.tensor])
                        m.update(pooled[k][(s.name, m.name)], r, t)
                        one = m.new()
                        m.update(one, r, t)
                        vals.append(m.value(one))
                    per_sample[k][m.name].append(m.worst(vals))
            bar.advance()
    rows = {}
    for k in labels:
        per_output = {s.name: {m.name: m.value(pooled[k][(s.name, m.name)]) for m in metric_objs} for s in specs}
        values = {m.name: m.worst([per_output[s.name][m.name] for s in specs]) for m in metric_objs}
        rows[k] = {"stage": k, "description": STAGES.get(k, "integer kernels vs the simulation"),
                   "values": values, "per_output": per_output, "per_sample": per_sample[k]}
    stages = [rows[k] for k in STAGES]
    first_drop, message = verdict({k: rows[k]["values"][first.name] for k in STAGES},
                                  rows["kernel-gap"]["values"][first.name], first.name, threshold)
    return StageReport(metrics=[m.name for m in metric_objs], outputs=[s.name for s in specs], samples=len(data),
                       threshold=threshold, stages=stages, kernel_gap=rows["kernel-gap"], first_drop=first_drop,
                       message=message, float_model=str(fpath) if fpath else "<ModelProto>",
                       calibrated_model=qm.source, optimized_model=str(optimized) if optimized else None)


def verdict(values, kernel_gap, metric, threshold):
    """``(first stage worse than threshold or None, one readable sentence)``.

    ``values``: ``{stage: value}`` for the stages in :data:`STAGES` order; ``kernel_gap``:
    the integer-vs-fake-quant value of the same metric.
    """
    m = get_metrics(metric)[0]
    if threshold is None:
        return None, (f"no threshold for {m.name}: compare the stages by eye or pass a threshold")
    for stage in STAGES:
        v = values[stage]
        if v != v or m.worse(v, threshold):
            return stage, f"{m.name} first falls below {threshold} at stage {stage!r} ({v:.6g}): {_ADVICE[stage]}"
    gap = ""
    if kernel_gap == kernel_gap and m.worse(kernel_gap, threshold):
        gap = (f"; the integer kernels differ from the simulation ({m.name} {kernel_gap:.6g} between them), "
               "so results on other data may not hold")
    return None, f"every stage keeps {m.name} at or above {threshold}{gap}"


def _register():
    from . import cli

    @cli.subcommand("stages", "compare the float, optimised float, fake-quant and integer-kernel models "
                    "on the same data to see at which stage accuracy drops")
    def cmd_stages(args):
        report = localize_stages(args.float_model_path, args.model, args.data, metrics=args.metrics,
                                 output_node=args.output_node, data_num=args.data_num, threshold=args.threshold,
                                 save_dir=args.save_dir, progress=not args.quiet)
        print(report.table())
        print(report.message)
        if report.optimized_model:
            print(f"wrote {report.optimized_model}")
        if args.json:
            print(f"wrote {report.save(args.json)}")
        return 0 if report else 1

    def configure(p):
        p.add_argument("float_model_path", metavar="FLOAT_MODEL", help="the float model (.onnx)")
        p.add_argument("model", metavar="CALIBRATED_MODEL", help="the calibrated QDQ model (.onnx)")
        p.add_argument("data", help="calibration data: DIR/<input>/<i>.npy, DIR/<input>.npy or one .npz")
        p.add_argument("--data-num", type=cli._positive_int, default=None,
                       help="use the first N samples only. Default: all")
        p.add_argument("-m", "--metrics", nargs="+", default=["cosine-similarity"], metavar="METRIC",
                       help="metrics; the first decides the verdict. Default: cosine-similarity")
        p.add_argument("--threshold", type=float, default=None,
                       help="value of the first metric a stage must keep. Default: 0.99 for cosine-similarity")
        p.add_argument("-o", "--output-node", nargs="+", default=None, metavar="OUTPUT",
                       help="model outputs (or slices 'name=out[:, 0:4]') to compare. Default: every output")
        p.add_argument("-s", "--save-dir", default=None,
                       help="write onnxruntime's optimised float model here. Default: write nothing")
        p.add_argument("--json", default=None, metavar="OUT", help="also save the report as JSON")
        p.add_argument("--quiet", action="store_true", help="no progress bar")

    cmd_stages.configure = configure


_register()

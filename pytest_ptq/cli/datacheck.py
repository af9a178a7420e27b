"""``check-data``: rule out the calibration data before blaming the quantization."""

from __future__ import annotations

from ..datacheck import check_data, vector
from ..tables import format_table, short
from . import args as a


def run(args):
    report = check_data(args.model, args.data, heldout=args.heldout, data_num=args.data_num,
                        float_model=args.float_model, metric=args.metric, threshold=args.threshold,
                        expect_mean=args.expect_mean, expect_std=args.expect_std, progress=not args.quiet,
                        custom_op_libraries=args.custom_op_library)
    rows = []
    for dataset, per_input in report.stats.items():
        for name, s in per_input.items():
            span = s.get("shape_span")  # "1,3,8..32,16..40": whole, not cut as a list of names would be
            rows.append({"data": dataset, "input": name, "samples": s["samples"],
                         "shape": ",".join(span) if span else "scalar" if s["shape"] == [] else s["shape"],
                         "dtype": s["dtype"], "min": s["min"], "max": s["max"], "mean": s["mean"],
                         "std": s["std"], "channel means": vector(s["channel_mean"]) if s["channel_mean"] else "",
                         "calibrated range": _span(s["calibrated_range"])})
    print(format_table(rows, ["data", "input", "samples", "shape", "dtype", "min", "max", "mean", "std",
                              "channel means", "calibrated range"]))
    if report.quantized:
        for dataset, values in report.quantized.items():
            print(f"fully quantized on the {'held-out' if dataset == 'heldout' else dataset} data: " + ", ".join(f"{k} {v:.6g}" for k, v in values.items()))
    print(report.text())
    if args.json:
        print(f"wrote {report.save(args.json)}")
    return 1 if report.errors else 0


def _span(pair):
    """A calibrated range at four significant digits: [-2.118, 2.64]."""
    return f"[{short(float(pair[0]))}, {short(float(pair[1]))}]" if pair else ""


def configure(p):
    a.add_model(p, engine=False)
    p.add_argument("--heldout", "--holdout", default=None, metavar="DIR",
                   help="held-out data in the same layout, to check that the calibration set represents it")
    p.add_argument("--expect-mean", type=a.number, nargs="+", action=a.Listed, default=None, metavar="M",
                   help="per-channel means correctly preprocessed data should have (e.g. 0 0 0 after normalisation; "
                   "one number stands for every channel)")
    p.add_argument("--expect-std", type=a.positive, nargs="+", action=a.Listed, default=None, metavar="S",
                   help="per-channel standard deviations correctly preprocessed data should have (one number: every "
                   "channel)")
    p.add_argument("--metric", type=a.metric, default=None, metavar="METRIC",
                   help=f"with --heldout: the metric of the held-out comparison; one of {', '.join(a.METRICS)}. "
                        "Default: cosine-similarity")
    p.add_argument("--threshold", type=a.number, default=None,
                   help="with --heldout: the value of --metric the fully quantized model keeps on the calibration data "
                        "and must keep on the held-out data (an error where it does not). Default: 0.99 for "
                        "cosine-similarity, else none (then a gap between the two is a warning)")
    a.add_json(p)


COMMANDS = [a.Command("check-data", "check calibration data: count, NaN/Inf, duplicates, layout, value range, "
                      "channel statistics, and (with --heldout) whether it represents other data", configure, run)]

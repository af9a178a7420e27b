"""``stages``: float, optimised float, fake-quant and integer kernels on the same data."""

from __future__ import annotations

from ..stages import localize_stages
from . import args as a


def run(args):
    report = localize_stages(args.float_model_path, args.model, args.data, metrics=args.metrics,
                             output_node=args.output_node, data_num=args.data_num, threshold=args.threshold,
                             save_dir=args.save_dir, progress=not args.quiet)
    print(report.table())
    for note in report.notes:
        print(f"note: {note}")
    print(report.message)
    if report.optimized_model:
        print(f"wrote {report.optimized_model}")
    if args.json:
        print(f"wrote {report.save(args.json)}")
    return 0 if report else 1


def configure(p):
    p.add_argument("float_model_path", metavar="FLOAT_MODEL", help="the float model (.onnx)")
    p.add_argument("model", metavar="CALIBRATED_MODEL", help="the calibrated QDQ model (.onnx)")
    p.add_argument("data", help=a.DATA_HELP)
    a.add_data_num(p)
    a.add_metrics(p, "the first decides the verdict")
    p.add_argument("--threshold", type=a.number, default=None,
                   help="value of the first metric a stage must keep. Default: 0.99 for cosine-similarity")
    a.add_output_node(p)
    a.add_save_dir(p, None, "the float model as onnxruntime optimises it (optimized_float_model.onnx)")
    a.add_json(p)
    a.add_quiet(p)


COMMANDS = [a.Command("stages", "compare the float, optimised float, fake-quant and integer-kernel models on the "
                      "same data to see at which stage accuracy drops", configure, run)]

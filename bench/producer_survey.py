"""Survey: does pytest-ptq analyse other quantizers' QDQ models right?

For every folder ``ROOT/<name>/`` holding ``model.onnx`` (the quantized model), ``float.onnx``
(the model given to the quantizer) and ``calib/<input>/<i>.npy``, measures what the
producers issue asks for and prints one row per model, then a tally per folder prefix
(producer_variant):

* load: the engine compiles it with the float model (or: refused, with the sentence);
* bypass: output cosine of every pair bypassed against float.onnx (or the rewrite the
  tool reports instead);
* quant: output cosine and max |diff| of the fully quantized engine against onnxruntime
  running model.onnx with QDQ fusion off (session.disable_quant_qdq=1), both at
  onnxruntime's default level (ORT_ENABLE_ALL), the file without onnxruntime's Relu/Clip-
  before-QuantizeLinear rewrites, which are wrong (Relu) or fail the session (Clip) on float8
  (see pytest_ptq.engine.runtime.ALWAYS_DISABLED);
* ranks: weight and activation sensitivities all finite;
* runall: finishes (one sample, top 2).

Usage: python bench/producer_survey.py ROOT [--only SUBSTRING] [--samples N]
       [--custom-op-library PATH] [--no-runall]
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
import traceback
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_ptq.data import load_data  # noqa: E402
from pytest_ptq.engine import Engine  # noqa: E402
from pytest_ptq.engine import runtime  # noqa: E402
from pytest_ptq.errors import NotQuantized, PTQError  # noqa: E402
from pytest_ptq.metrics import compare  # noqa: E402
from pytest_ptq.runall import runall  # noqa: E402
from pytest_ptq.sensitivity import get_sensitivity_of_nodes  # noqa: E402


def plain_run(path, feeds, libraries):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.add_session_config_entry("session.disable_quant_qdq", "1")
    so.log_severity_level = 3
    for lib in libraries:
        so.register_custom_ops_library(lib)
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"],
                                disabled_optimizers=list(runtime.ALWAYS_DISABLED))
    names = [o.name for o in sess.get_outputs()]
    return [dict(zip(names, sess.run(names, f))) for f in feeds]


def survey(folder, samples, libraries, do_runall):
    row = {"model": folder.name}
    model, fmodel = folder / "model.onnx", folder / "float.onnx"
    data = load_data(folder / "calib")
    feeds = [data.sample(i) for i in range(min(samples, len(data)))]
    start = time.perf_counter()
    try:
        engine = Engine(model, {k: [f[k] for f in feeds] for k in feeds[0]}, float_model=fmodel,
                        custom_op_libraries=libraries)
    except NotQuantized as exc:
        row.update(load="no Q/DQ", why=str(exc))
        return row
    except PTQError as exc:
        row.update(load="refused", why=str(exc))
        return row
    except TypeError:
        engine = Engine(model, {k: [f[k] for f in feeds] for k in feeds[0]}, float_model=fmodel)
    row["load"] = "ok"
    row["producer"] = engine.qmodel.made_by.label
    row["warnings"] = list(engine.warnings)
    outs = engine.model_outputs
    if engine.rewrite:
        row["bypass"] = f"rewrite {engine.rewrite['cosine']:.4f}"
    else:
        fsess = runtime.make_session(__import__("onnx").load(str(fmodel)), "all", ["CPUExecutionProvider"])
        fnames = [o.name for o in fsess.get_outputs()]
        cos = 1.0
        for i, f in enumerate(feeds):
            ref = dict(zip(fnames, fsess.run(fnames, f)))
            got = engine.run(i, ())
            cos = min([cos] + [compare(ref[k], got[k])["cosine-similarity"] for k in outs if k in ref])
        row["bypass"] = f"{cos:.6f}"
    try:
        plain = plain_run(model, feeds, libraries)
        cos, diff = 1.0, 0.0
        for i in range(len(feeds)):
            got = engine.run(i, "all")
            for k in outs:
                cos = min(cos, compare(plain[i][k], got[k])["cosine-similarity"])
                diff = max(diff, float(np.abs(plain[i][k].astype(np.float64) - got[k]).max()))
        row["quant"] = f"{cos:.6f} / {diff:.2e}"
    except Exception as exc:  # onnxruntime itself cannot run the file with fusion off
        row["quant"] = f"ORT fails: {str(exc).splitlines()[0][:80]}"
    finite = True
    counts = {}
    for kind in ("weight", "activation"):
        s = get_sensitivity_of_nodes(engine, node_type=kind, data_num=1)
        counts[kind] = len(s)
        finite &= all(math.isfinite(v["cosine-similarity"]) for v in s.values())
    row["ranks"] = f"{'finite' if finite else 'NOT FINITE'} (w {counts['weight']}, a {counts['activation']})"
    if do_runall:
        with tempfile.TemporaryDirectory() as tmp:
            s = runall(engine, save_dir=tmp, data_num=1, top=2, progress=False)
        row["runall"] = s["verdict"]["source"]
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root")
    p.add_argument("--only", default="")
    p.add_argument("--samples", type=int, default=2)
    p.add_argument("--custom-op-library", action="append", default=[])
    p.add_argument("--no-runall", action="store_true")
    args = p.parse_args(argv)
    rows = []
    for folder in sorted(Path(args.root).iterdir()):
        if not (folder / "model.onnx").exists() or args.only not in folder.name:
            continue
        try:
            row = survey(folder, args.samples, args.custom_op_library, not args.no_runall)
        except Exception as exc:
            row = {"model": folder.name, "load": "CRASH", "why": "".join(
                traceback.format_exception_only(type(exc), exc)).strip().splitlines()[-1][:200]}
        rows.append(row)
        print(" | ".join(f"{k}={v}" for k, v in row.items() if k != "warnings"), flush=True)
    tally = defaultdict(lambda: defaultdict(int))
    for r in rows:
        tally[r["model"].rsplit("_", 2)[0]][r["load"]] += 1
    print("\nper producer_variant:", {k: dict(v) for k, v in tally.items()})


if __name__ == "__main__":
    main()

"""The session's HTML report: one self-contained page, every model, failing models first.

Each model gets its verdict, the tests that used it and their checks, the output metrics,
the most sensitive nodes, what its tests asked for beyond that (calibration data findings,
the stage comparison, remedy searches with their settings and curves), the cumulative
error curves and the distributions of its most sensitive nodes. Figures are embedded as
palette PNGs (base64) downscaled to a browser-friendly width, and the page drops figures
past a size budget, so a report of many models stays a few MB. No script, no external
resource: the page opens anywhere, offline.
"""

from __future__ import annotations

import base64
import datetime
import html
import io
import re
from pathlib import Path

from . import guard
from .errors import PTQError
from .figures import drawn_by
from .metrics import METRICS
from .outputs import parse_outputs, parts_note
from .results import json_safe
from .sensitivity import NO_VALUES
from .tables import fmt, threshold_text

# Figures wider than this are downscaled: wider than a laptop screen helps no one.
MAX_WIDTH = 1000
# A box plot keeps up to this width, scrolled sideways: shrunk to MAX_WIDTH, 64 channels'
# labels were 4 pixels high
WIDE_WIDTH = 1800
# Embedded figures stop here; a browser handles a few MB without complaint.
IMAGE_BUDGET = 4 * 2**20
DISTRIBUTIONS = 3
# Marks a page as pytest-ptq's, so that a rerun replaces it and nothing else.
GENERATOR = '<meta name="generator" content="pytest-ptq">'
OUTPUT_METRICS = ["cosine-similarity", "sqnr", "mre", "chebyshev"]


def compress_png(path, max_width=MAX_WIDTH):
    """PNG bytes of the image at ``path``, downscaled to ``max_width`` and palette-encoded."""
    from PIL import Image

    with Image.open(path) as img:
        img = img.convert("RGB")
        if img.width > max_width:
            img = img.resize((max_width, round(img.height * max_width / img.width)), Image.Resampling.LANCZOS)
        # an octree palette keeps thin coloured lines apart (median cut merges them into the
        # white background's buckets) at a quarter of the RGB size
        img = img.quantize(colors=128, method=Image.Quantize.FASTOCTREE)
        buf = io.BytesIO()
        img.save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def _image(path, title, wide=False):
    """``wide``: kept up to :data:`WIDE_WIDTH` and shown at that size, scrolled sideways."""
    png = compress_png(path, WIDE_WIDTH if wide else MAX_WIDTH)
    return {"title": title, "png": base64.b64encode(png).decode("ascii"), "wide": wide}


def collect(session):
    """JSON-safe data of every model the session analysed (computes curves and figures)."""
    return json_safe([session.report_payload(a) for a in session.analyses.values()
                      if any(a.key.id in rec.models for rec in session.tests.values())])


def payload_of(session, analysis):
    """The report data of one model of ``session`` (its tests so far); computes curves and
    figures, so it needs the model's engine."""
    model_id = analysis.key.id
    # the terminal's diagnosis of the model was made with its test's settings (a contract's
    # node type): the report shows the same
    settings = session.explained_with.get(model_id, session.settings)
    tests = [{"nodeid": rec.nodeid, "outcome": rec.outcome, "section": rec.section, "xfail_reason": rec.xfail_reason,
              "reason": rec.reason, "diagnosed": rec.diagnosed,
              "results": [r.to_dict() for mid, r in rec.results if mid == model_id]}
             for rec in session.tests.values() if model_id in rec.models]
    payload = model_payload(analysis, tests, settings, session.judged_on(model_id),
                            session.suggest_commands(analysis, settings))
    payload["warnings"] = session.warnings_of(analysis)  # their commands as this run names paths
    payload["evidence"] = session.evidence_of(model_id)
    return payload


def model_payload(analysis, tests, settings, holdout=None, suggest=()):
    """The report data of one model; analysis errors become notes, not crashes. ``holdout``:
    the held-out data its checks judged on, where its verdict is decided."""
    key = analysis.key
    data = {"id": key.id, "label": analysis.label, "data": analysis.relative(key.data),
            "float_model": analysis.relative(key.float_model) if key.float_model else None,
            "data_num": key.data_num, "tests": tests, "outputs": [], "sensitivity": None,
            "images": [], "notes": [], "warnings": [], "diagnosis": None, "suggest": [list(c) for c in suggest]}
    # only what tests computed: the report runs no data check, stage comparison or search itself
    data["data_checks"] = [_data_check(analysis, r) for r in analysis.computed("data_check")]
    data["stages"] = [_stages(analysis, r) for r in analysis.computed("stages")]
    data["remedies"] = [_remedy(r, data["notes"]) for r in analysis.computed("remedy")]
    try:
        from .diagnosis import warning

        data["samples"] = analysis.samples
        qm = analysis.engine.qmodel
        data["format"], data["made_by"] = qm.format_label, qm.made_by.label
        data["warnings"] = [warning(w) for w in analysis.warnings]
        values = analysis.output_metrics(None, OUTPUT_METRICS).values
        data["outputs"] = [{"output": o, **{k: NO_VALUES if x is None else x for k, x in v.items()}}
                           for o, v in values.items()]
        data["output_parts"] = parts_note(parse_outputs(None, analysis.engine))
        d = None
        # why it fails, for a model whose check or assert fails (or fails as expected): its verdict
        # costs three passes over every calibration and held-out sample, which a passing model is
        # spared, and a missing baseline or an input error says what to do in its own sentence
        if any(t["outcome"] in ("failed", "error", "xfailed") and t.get("diagnosed", True) for t in tests):
            d = analysis.diagnosis(settings.node_type, settings.metric, holdout, settings.top)
            data["diagnosis"] = {**d.to_dict(), "cause_text": d.cause_text(), "caveat": d.caveat(),
                                 "cause": d.cause, "headline": d.headline()}
        ranked = settings.node_type if d is None else d.node_type  # the kind the diagnosis ranked
        sens = analysis.sensitivity(ranked, settings.metric)
        data["sensitivity"] = {"node_type": ranked, "metric": settings.metric,
                               "nodes": len(sens), "rows": sens.rows()[:settings.top], "samples": sens.samples}
        data["images"] += _figures(analysis, sens, settings, data["notes"], d)
    except PTQError as exc:
        data["notes"].append(f"analysis failed: {exc}")
    return data


def _data_check(analysis, report):
    """A :class:`~pytest_ptq.datacheck.DataReport` as report data: findings and statistics."""
    findings = [{"severity": f.severity, "check": f.check, "dataset": f.dataset, "input": f.input or "",
                 "message": f.message, "fix": f.fix} for f in report.findings]
    stats = [{"data": dataset, "input": name, "samples": st["samples"], "shape": st["shape"], "dtype": st["dtype"],
              "min": st["min"], "max": st["max"], "mean": st["mean"], "std": st["std"],
              "calibrated range": _span(st["calibrated_range"])}
             for dataset, per_input in report.stats.items() for name, st in per_input.items()]
    heldout = analysis.relative(report.heldout) if report.heldout else None
    return {"key": f"data|{heldout}", "data": analysis.relative(report.data), "heldout": heldout,
            "findings": findings, "stats": stats, "quantized": report.quantized}


def _span(pair):
    return f"[{pair[0]:.4g}, {pair[1]:.4g}]" if pair else ""


def _stages(analysis, report):
    """A :class:`~pytest_ptq.stages.StageReport` as report data: one row per stage."""
    rows = [{"stage": s["stage"], **s["values"], "description": s["description"]} for s in report.stages]
    rows.append({"stage": "integer vs fake-quant", **report.kernel_gap["values"],
                 "description": "how far the integer kernels are from the simulation"})
    float_model = analysis.relative(report.float_model)
    return {"key": f"stages|{float_model}", "float_model": float_model, "samples": report.samples,
            "metrics": list(report.metrics), "rows": rows}


def _remedy(result, notes):
    """A :class:`~pytest_ptq.remedy.Remedy` as report data, its search curve drawn as a PNG."""
    from .remedy import plot_remedy

    decisive = result.requantized
    judged = result.figures.get(result.judged_on, {})
    row = {"remedy": result.remedy, "metric": result.objective.get("metric", result.metric),
           "target": result.target_text, "judged on": result.judged_on, "met": "yes" if result.met else "no",
           "nodes": len(result.nodes), "simulated": result.value, "judged": judged.get("after"),
           "re-quantized": decisive[1].get("value") if decisive else None,
           "re-quantized with": decisive[0] if decisive else None, "baseline": result.baseline,
           "every candidate": result.ceiling}
    # the same search on two xdist workers finds the same nodes: one entry
    entry = {"key": "|".join(["remedy", result.remedy, result.metric, result.target_text, ",".join(result.outputs),
                              ",".join(result.nodes)]),
             "row": row, "summary": result.summary(), "settings": result.settings, "image": None}
    if result.curve:
        try:
            with guard.scratch("ptq-remedy-") as tmp:
                png = plot_remedy(result, tmp / "remedy.png")
                entry["image"] = _image(png, f"Remedy search ({result.remedy}): {result.metric} with the k most "
                                             f"sensitive nodes remedied, target {result.target_text}")
        except (PTQError, ValueError, OSError) as exc:
            notes.append(f"remedy curve not shown: {exc}")
    return entry


def _plot_curves(analysis, settings, tmp):
    from .curves import plot_curves

    curves = analysis.curves(settings.metric)
    return plot_curves(curves, tmp / "curves.png",
                       title=f"Cumulative {curves.metric} vs float, {analysis.label}, {curves.samples} sample(s)")


def curves_png(analysis, settings):
    """The cumulative curves of ``analysis`` as base64 PNG text, drawn once per model (kept
    on disk with its results: a rerun draws nothing)."""
    def draw():
        with guard.scratch("ptq-curves-") as tmp:
            return base64.b64encode(compress_png(_plot_curves(analysis, settings, tmp))).decode("ascii")

    png = analysis.cached(("curves_png", settings.metric, analysis.label, drawn_by()), draw, files=())
    # a kept entry goes into the page as is: only a PNG's base64 text may (anything else is drawn again)
    return png if is_png_text(png) else draw()


_BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")
_PNG_BASE64 = base64.b64encode(b"\x89PNG\r\n\x1a\n").decode("ascii")[:8]


def is_png_text(text):
    """Whether ``text`` is base64 text of a PNG file (nothing else goes into an ``<img>``)."""
    return isinstance(text, str) and text.startswith(_PNG_BASE64) and _BASE64.fullmatch(text) is not None


def results_html(results):
    """A small table of check results (for pytest-html)."""
    rows = [{"check": r["kind"], "verdict": "ok" if r["passed"] else "FAIL", "summary": r["summary"]}
            for r in results]
    return _table(rows, ["check", "verdict", "summary"], "ptq-results")


def _figures(analysis, sens, settings, notes, diagnosis=None):
    """The cumulative curves, then for each of the top ``DISTRIBUTIONS`` nodes its
    distribution and, for an operator, the distribution of the input its diagnosis blames
    (with that input's box plot when the reason is its channels): the figure behind each
    "why"."""
    images = [{"title": "Cumulative error: each operator's output against the float model's, in execution order, "
                        "with only the weights, only the activations, and everything quantized",
               "png": curves_png(analysis, settings)}]
    top = list(sens)[:DISTRIBUTIONS]
    if not top:
        return images
    blamed = {}  # node -> the calibration input its reason is about
    for it in (diagnosis.nodes if diagnosis is not None else []):
        if it["node"] in top and it["kind"] == "operator" and it.get("chosen"):
            blamed[it["node"]] = it["chosen"][0]
    boxed = [c for c in blamed.values() if "channel" in next(
        (i["reason"] for it in diagnosis.nodes for i in it["inputs"] if i["node"] == c), "")] if diagnosis else []
    metric = settings.metric
    # what the figures show, all of it: kept on disk with the model's results under that key,
    # so that a rerun of an unchanged suite draws nothing (drawing was 2/3 of such a rerun)
    request = ("distribution figures", metric, tuple(top), tuple(sorted(blamed.items())), tuple(boxed),
               sens.samples, tuple(None if sens[n][metric] is None else float(sens[n][metric]) for n in top), drawn_by())
    drawn, failure = analysis.cached(request, lambda: _distribution_figures(analysis, sens, metric, top, blamed,
                                                                           boxed), files=())
    if failure:
        notes.append(failure)
    return images + drawn


def _ranked_figure(value):
    """A ranking's figure as a sentence shows it; None: the node changes only outputs holding no values."""
    return NO_VALUES if value is None else fmt(value)


def _distribution_figures(analysis, sens, metric, top, blamed, boxed):
    """The figures of :func:`_figures` after the curves, and the note saying why some are
    missing (or None)."""
    from .distribution import collect, draw_channelwise, draw_distribution

    images, shown = [], {}  # (node, "distribution" or "channels") -> its image
    try:
        with guard.scratch("ptq-distributions-") as tmp:
            dist, boxes = collect(analysis.engine, list(dict.fromkeys(top + list(blamed.values()))), boxed,
                                  data_num=sens.samples, skip_unboxable=True)
            for k, node in enumerate(top, 1):
                d = dist.get(node)
                if not d or "skipped" in d:  # an empty tensor: no figure to show
                    continue
                rank = (f"sensitivity rank {k}: {metric} {_ranked_figure(sens[node][metric])} at the model outputs with only "
                        "this node quantized")
                if d.get("kind") == "node":
                    rank += ("; the figure's cosine is this node's own output with every pair quantized, error "
                             "accumulated from upstream included")
                c = blamed.get(node)
                # a figure shown already (an input two ranked nodes blame, a ranked pair an operator
                # above blamed) is named, not drawn again
                if (node, "distribution") in shown:
                    first = shown[node, "distribution"]
                    first["title"] += f"; also {rank}"
                else:
                    above = [w for w in ("distribution", "channels") if (c, w) in shown]
                    told = (f"; its 'why' is about {c}, whose {' and '.join(above)} {'is' if len(above) == 1 else 'are'}"
                            " shown above") if above else ""
                    images.append(_image(draw_distribution(d, tmp, boxes.get(node)),
                                         f"Distribution of {node} ({rank}){told}"))
                    shown[node, "distribution"] = images[-1]
                if c and c in dist and "skipped" not in dist[c] and c != node and (c, "distribution") not in shown:
                    images.append(_image(draw_distribution(dist[c], tmp, boxes.get(c)), f"Distribution of {c}, the "
                                         f"{dist[c]['kind']} input of {node} that its 'why' is about"))
                    shown[c, "distribution"] = images[-1]
                if c in boxes and "skipped" not in boxes[c] and (c, "channels") not in shown:
                    images.append(_image(draw_channelwise(boxes[c], tmp, dist.get(c)),
                                         f"Channels of {c}, the input of {node} whose channels its 'why' is about",
                                         wide=True))
                    shown[c, "channels"] = images[-1]
    except (PTQError, TypeError, ValueError) as exc:
        return images, f"distributions not shown: {exc}"
    # a ranked node whose tensor is empty has no figure: said, as runall's summary and the
    # debug API say it, not left for the reader to miss among the figures
    empty = [node for node in top if "skipped" in dist.get(node, {})]
    if empty:
        return images, (f"no distribution for {', '.join(map(repr, empty))} ({empty[0]!r}: "
                        f"{dist[empty[0]]['skipped']})")
    return images, None


def merge(models):
    """One entry per model from several workers' lists: tests united, figures kept once."""
    merged = {}
    for m in models:
        if m["id"] not in merged:
            merged[m["id"]] = dict(m, tests=list(m["tests"]))
            continue
        into = merged[m["id"]]
        seen = {t["nodeid"] for t in into["tests"]}
        into["tests"] += [t for t in m["tests"] if t["nodeid"] not in seen]
        if m.get("diagnosis") and (not into.get("diagnosis") or m.get("evidence", []) > into.get("evidence", [])):
            # a worker whose test of it failed, the one with the most results where several did
            # (see PTQSession.evidence_of): its ranking and figures follow the diagnosis
            # (--dist loadfile put a model's failing items on another worker than its first)
            for field in ("diagnosis", "sensitivity", "images", "evidence", "suggest"):
                into[field] = m.get(field)
        for field in ("images", "outputs", "sensitivity"):
            if not into.get(field) and m.get(field):
                into[field] = m[field]
        for field in ("data_checks", "stages", "remedies"):  # each worker may have computed others
            have = {e["key"] for e in into.get(field, [])}
            into[field] = list(into.get(field, [])) + [e for e in m.get(field, []) if e["key"] not in have]
        into["notes"] = list(dict.fromkeys(into["notes"] + m["notes"]))
    return list(merged.values())


def verdict(model):
    """``failed`` when any of its tests failed or errored, else ``xfailed`` when any failed as
    expected (the model misses a check, knowingly), else ``passed``, else ``skipped``."""
    outcomes = {t["outcome"] for t in model["tests"]}
    if outcomes & {"failed", "error"}:
        return "failed"
    if "xfailed" in outcomes:
        return "xfailed"
    return "passed" if "passed" in outcomes else "skipped"


# failing models first, then those failing as expected: both are what a reader looks for
_ORDER = {"failed": 0, "xfailed": 1, "passed": 2, "skipped": 3}

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em;color:#222;max-width:1280px}
h1{margin-bottom:.2em} h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.5em 0 1em;font-size:.9em}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#f3f3f3} td.num{text-align:right;font-family:ui-monospace,monospace}
.v-failed,.v-error{color:#b00020;font-weight:bold} .v-passed{color:#1b7f2a;font-weight:bold}
.v-skipped,.v-xfailed{color:#8a6d00} li.v-passed,li.v-failed{font-weight:normal}
pre{background:#f7f7f7;border:1px solid #ddd;padding:.6em;overflow-x:auto;font-size:.85em}
.scroll{overflow-x:auto;max-width:100%}
figure{margin:1em 0} figure img{max-width:100%;height:auto;border:1px solid #ddd}
figure.wide img{max-width:none}
figcaption{font-size:.85em;color:#555} .note{color:#8a6d00} .warning{color:#8a3d00}
.why{border-left:4px solid #b00020;background:#fff7f7;padding:.2em 1em .5em;margin:1em 0}
section[data-verdict=passed] .why{border-left-color:#1b7f2a;background:#f6fbf6}
section[data-verdict=xfailed] .why{border-left-color:#8a6d00;background:#fffbef}
.why td.num.v-failed{color:#b00020} pre.snippet{white-space:pre-wrap}
table.summary td:first-child{overflow-wrap:break-word;min-width:8em;max-width:22em}
table.summary td:last-child,.why td.c-measured,table.sensitivity td.c-node{min-width:14em}
.why table.measures{font-size:.85em} .why td.c-test,.why td.c-on{overflow-wrap:break-word;max-width:20em}
table.sensitivity{font-size:.82em} table.sensitivity td.c-why{min-width:26em} td.c-try{min-width:7em}
table.tests{table-layout:fixed;width:100%} table.tests th:first-child{width:25%} table.tests th:nth-child(2){width:6em}
table.tests td{overflow-wrap:break-word} table.tests td pre{white-space:pre;overflow-x:auto}
"""


def _e(text):
    return html.escape(str(text), quote=True)


# A run of text this long without a space: a node name, a path.
_LONG_RUN = re.compile(r"\S{20,}")


def _w(text):
    """``text`` escaped, with a line-break opportunity after each '/', '.', '_' and '::' of a
    long name: 150 characters of scoped node name, unbreakable, pushed the tables past the page's
    right edge, and ``overflow-wrap:anywhere`` squeezed its column to a few characters."""
    return _LONG_RUN.sub(lambda m: re.sub(r"([/._]|::)", r"\1<wbr>", m.group()), _e(text))


# Columns of names: a node or output named "inf" or "nan" is a name there, not the spelling
# json_safe gives a non-finite number
_NAME_COLUMNS = {"node", "nodes", "output", "input", "feeds", "data", "dataset", "test", "check", "stage", "remedy"}


def _cell(value, cls="", name=False):
    if isinstance(value, float) or (not name and isinstance(value, str) and value in ("inf", "-inf", "nan")):
        return f'<td class="num">{_e(fmt(float(value)))}</td>'
    if isinstance(value, (int,)) and not isinstance(value, bool):
        return f'<td class="num">{value}</td>'
    attr = f' class="{cls}"' if cls else ""
    if isinstance(value, list):
        return f"<td{attr}>{_w(', '.join(str(v) for v in value))}</td>"
    return f"<td{attr}>{_w('' if value is None else value)}</td>"


def _slug(column):
    """A table column's cell class: ``c-`` and the column name (``c-why``)."""
    return "c-" + "".join(ch if ch.isalnum() else "-" for ch in str(column)).strip("-")


def _table(rows, columns, cls=""):
    head = "".join(f"<th>{_e(c)}" + (f" ({_e(METRICS[c].units)})" if c in METRICS and METRICS[c].units else "")
                   + "</th>" for c in columns)
    body = "".join("<tr>" + "".join(_cell(r.get(c), _slug(c), c in _NAME_COLUMNS) for c in columns) + "</tr>" for r in rows)
    return _scroll(f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>')


def _scroll(table):
    """``table`` in a box that scrolls sideways where it is wider than the page, which then
    keeps its width (the rest of the page stays readable)."""
    return f'<div class="scroll">{table}</div>'


def _model_html(k, m):
    v = verdict(m)
    parts = [f'<section class="model" data-verdict="{v}" id="model-{k}">',
             f'<h2>{_w(m["label"])} <span class="v-{v}">{v.upper()}</span></h2>',
             f'<p>{_e(m["format"]) + " format, made by " + _e(m.get("made_by")) + "; " if m.get("format") else ""}'
             f'data {_e(m["data"])}, {_e(m.get("samples", "?"))} sample(s)'
             + (f', float model {_e(m["float_model"])}' if m.get("float_model") else "") + "</p>"]
    parts += _why_html(m, v)
    for note in m["notes"]:
        parts.append(f'<p class="note">{_e(note)}</p>')
    parts.append("<h3>Tests</h3>")
    rows = []
    for t in sorted(m["tests"], key=lambda t: (t["outcome"] not in ("failed", "error"), t["nodeid"])):
        checks = "".join(f'<li class="v-{"passed" if r["passed"] else "failed"}">{_w(r["summary"])}</li>'
                         for r in t["results"])
        details = "".join(f"<pre>{_e(r['details'])}</pre>" for r in t["results"] if not r["passed"] and r["details"])
        reason = f'<p class="note">expected to fail: {_e(t["xfail_reason"])}</p>' if t.get("xfail_reason") else ""
        if _unmeasured(t):
            reason += f'<p class="v-failed">{_e(t["reason"])}</p>'
        rows.append(f'<tr><td>{_w(t["nodeid"])}</td><td class="v-{t["outcome"]}">{_e(t["outcome"])}</td>'
                    f"<td>{reason}<ul>{checks}</ul>{details}</td></tr>")
    parts.append(_scroll('<table class="tests"><thead><tr><th>test</th><th>outcome</th><th>checks</th></tr></thead>'
                         f"<tbody>{''.join(rows)}</tbody></table>"))
    if m["outputs"]:
        parts.append(f"<h3>Output metrics on the calibration data (fully quantized vs float, "
                     f"{_e(m.get('samples', '?'))} sample(s))</h3>")
        cols = ["output"] + [c for c in OUTPUT_METRICS if c in m["outputs"][0]]
        parts.append(_table(m["outputs"], cols, "outputs"))
        parts += [f'<p class="note">{_e(note[0].upper() + note[1:])}.</p>' for note in m.get("output_parts", [])]
    parts += _nodes_html(m)
    parts += _extras_html(m)
    for img in m["images"]:
        parts.append(_figure(img))
    if m.get("images_dropped"):
        parts.append(f'<p class="note">{m["images_dropped"]} figure(s) left out to keep this page small.</p>')
    parts.append("</section>")
    return "\n".join(parts)


def measures(m):
    """Every measured value of the model's checks beside its threshold, failing first."""
    rows = []
    for t in m["tests"]:
        for r in t["results"]:
            for x in r.get("measures", []):
                what = x["what"] + (f" ({x['detail']})" if x.get("detail") else "")
                rows.append({"check": r["kind"], "measured": what, "value": x["value"],
                             "threshold": f"{x['bound']} {threshold_text(x['threshold'])}" if x.get("bound") else "",
                             "on": x.get("on", ""), "result": "ok" if x["passed"] else "FAIL",
                             # an expected failure beside real ones says so: it is not one of them
                             "test": t["nodeid"] + (" (xfail)" if t["outcome"] == "xfailed" else ""),
                             "_passed": x["passed"], "_outcome": t["outcome"]})
    # two tests making the same check on the same data (a contract's data_check and a test's
    # assert_data) measure the same: one row, naming both tests
    merged = {}
    for r in rows:
        key = tuple(str(r[c]) for c in ("check", "measured", "value", "threshold", "on", "result"))
        if key in merged:
            if r["test"] not in merged[key]["test"].split(", "):
                merged[key]["test"] += ", " + r["test"]
        else:
            merged[key] = r
    rows = list(merged.values())
    rows.sort(key=lambda r: r["_passed"])
    return rows


def headline(m):
    """The contract's own figure for the summary: the worst output measure of its output
    checks (on the data they used, held-out when they used it), with its threshold; else the
    fully quantized cosine on calibration data, which no threshold judged."""
    outs = [r for r in measures(m) if r["check"] == "outputs"]
    if outs:
        worst = min(outs, key=lambda r: (r["_passed"], r["value"] if isinstance(r["value"], float) else 0))
        on = worst["on"].split(" (", 1)[0]  # the data's path is in the model's section
        return (worst["value"], f"{worst['measured']} on {on}, needs {worst['threshold']}",
                "v-passed" if worst["_passed"] else "v-failed")
    worst = min((r.get("cosine-similarity", float("nan")) for r in m["outputs"]
                 if r.get("cosine-similarity") != NO_VALUES), default=None)
    if worst is None:
        return None, "", ""
    return worst, "fully quantized cosine on the calibration data (no output check ran)", ""


def _unmeasured(t):
    """Whether test ``t`` failed with no check saying why (an input error, an error in the
    user's code): its report shows what it failed with."""
    return bool(t.get("reason")) and t["outcome"] in ("failed", "error") and all(r["passed"] for r in t["results"])


def _why_html(m, v):
    """Why the model fails (or what would fail first): its checks beside their thresholds,
    the cause with its figures, and the fix to try."""
    d = m.get("diagnosis")
    parts = []
    if v in ("failed", "xfailed"):
        title = "Why it fails" if v == "failed" else "Why it fails (expected: xfail)"
    else:
        title = "Its checks"
    parts.append(f'<div class="why"><h3>{title}</h3>')
    rows = measures(m)
    if rows:
        parts.append(_table(rows, ["check", "measured", "value", "threshold", "on", "result", "test"], "measures"))
    for t in filter(_unmeasured, m["tests"]):
        parts.append(f'<p class="v-failed">{_e(t["nodeid"])}: {_e(t["reason"])}</p>')
    if d:
        parts.append(f'<p class="cause"><b>{_e(d["cause_text"])}</b></p>')
        vd = d["verdict"]
        sets = list(vd["values"])
        vrows = [{"quantized": label, **{f"{vd['metric']}, {_set(k)} ({vd['samples'][k]} samples)": vd["values"][k][key]
                                         for k in sets}}
                 for label, key in (("weights only", "weight only"), ("activations only", "activation only"),
                                    ("everything", "all quantized"))]
        parts.append(_table(vrows, list(vrows[0]), "verdict"))
        if d.get("caveat"):
            parts.append(f'<p class="note">{_e(d["caveat"])}</p>')
        if d["fixes"]:
            parts.append(f"<p>Fix to try, in the terms of {_e(d['terms'])} (most useful first):</p><ol class=\"fixes\">"
                         + "".join(f"<li>{_w(f['text'])}</li>" for f in d["fixes"]) + "</ol>")
            if d.get("snippet"):
                parts.append(f'<pre class="snippet">{_e(d["snippet"])}</pre>')
            if d.get("producer_terms"):
                parts.append(f'<pre class="snippet">{_e(chr(10).join(d["producer_terms"]))}</pre>')
        for what, command in m.get("suggest", []) if v in ("failed", "xfailed") else []:
            judged = ("the held-out data" if "--heldout" in command else "calibration samples it did not choose on")
            parts.append(f"<p>The smallest set of nodes that meets {_e(what)}, searched on the calibration data, "
                         f"accepted on {judged} and re-quantized (minutes):</p><pre>{_e(command)}</pre>")
    for w in m.get("warnings", []):
        first, *causes = w["text"].split("\n")
        fix = f"fix: {_e(w['fix'])}" if w.get("fix") else ""
        parts.append(f'<p class="warning">warning: {_e(first)}' + (f"; {fix}" if fix and not causes else "") + "</p>")
        if causes:
            parts.append('<ul class="warning">' + "".join(f"<li>{_e(c)}</li>" for c in causes)
                         + (f"<li>{fix}</li>" if fix else "") + "</ul>")
    parts.append("</div>")
    return parts


def _set(key):
    return {"heldout": "held-out", "calibration": "calibration"}.get(key, key)


def _nodes_html(m):
    s, d = m.get("sensitivity"), m.get("diagnosis")
    if not s:
        return []
    metric = s["metric"]
    kind = "nodes" if s["node_type"] == "node" else f'{s["node_type"]} nodes'
    parts = [f'<h3>Most sensitive {_e(kind)} ({len(s["rows"])} of {s["nodes"]})</h3>'
             f'<p>{_e(metric)} at the model outputs with only that node quantized (an operator: the Q/DQ pairs '
             f'feeding it, and one on a model output that it writes), on {_e(s.get("samples", "?"))} calibration sample(s), worst first. "cause" says which '
             'of an '
             "operator's inputs costs more, weights or activations, each quantized alone; \"why\" reads its "
             "statistics." + ("" if d else " (A passing model is not diagnosed.)") + "</p>"]
    by_node = {n["node"]: n for n in (d or {}).get("nodes", [])}
    rows = []
    for k, r in enumerate(s["rows"], 1):
        n = by_node.get(r["node"], {})
        split = n.get("split") or {}
        kind_of = n.get("kind", {"node": "operator"}.get(s["node_type"], s["node_type"]))
        op = r.get("op_type") or n.get("op_type", "")
        what = f"{kind_of} ({op})" if kind_of == "operator" else f"{kind_of} into {op}" if op else kind_of
        rows.append({"rank": k, "node": r["node"], "kind": what, metric: NO_VALUES if r[metric] is None else r[metric],
                     "weights alone": split.get("weight"), "activations alone": split.get("activation"),
                     "cause": n.get("cause") or "", "why": n.get("reason", ""), "try": ", ".join(n.get("try", [])),
                     **{c: r[c] for c in ("threshold", "bit", "feeds") if c in r}})
    cols = ["rank", "node", "kind", metric]
    if any(r["weights alone"] is not None for r in rows):
        cols += ["weights alone", "activations alone"]
    cols += (["cause", "why", "try"] if d else []) + [c for c in ("threshold", "bit", "feeds") if any(c in r for r in rows)]
    parts.append(_table(rows, cols, "sensitivity"))
    return parts


def _figure(img):
    if not is_png_text(img["png"]):
        return f"<p>{_e(img['title'])}: not shown (a kept figure that is not a PNG)</p>"
    tag = f'<img src="data:image/png;base64,{img["png"]}" alt="{_e(img["title"])}">'
    if img.get("wide"):
        tag = f'<div class="scroll">{tag}</div>'
    return (f'<figure class="{"wide" if img.get("wide") else ""}">{tag}'
            f"<figcaption>{_e(img['title'])}</figcaption></figure>")


def _extras_html(m):
    """The data checks, stage comparisons and remedy searches the model's tests ran."""
    parts = []
    for d in m.get("data_checks", []):
        held = f" against held-out data {d['heldout']}" if d["heldout"] else ""
        count = {s: sum(f["severity"] == s for f in d["findings"]) for s in ("error", "warning", "info")}
        parts.append(f"<h3>Calibration data check{_e(held)}</h3>"
                     f'<p>{_e(d["data"])}: {count["error"]} error(s), {count["warning"]} warning(s), '
                     f'{count["info"]} note(s).</p>')
        if d["findings"]:
            parts.append(_table(d["findings"], ["severity", "check", "dataset", "input", "message", "fix"],
                                "findings"))
        else:
            parts.append("<p>No problem found.</p>")
        parts.append(_table(d["stats"], ["data", "input", "samples", "shape", "dtype", "min", "max", "mean", "std",
                                         "calibrated range"], "data-stats"))
        for dataset, values in (d.get("quantized") or {}).items():
            parts.append(f"<p>Fully quantized on the {_e(dataset)} data: "
                         + _e(", ".join(f"{k} {fmt(float(v))}" for k, v in values.items())) + ".</p>")
    for st in m.get("stages", []):
        parts.append(f"<h3>Stages against float model {_e(st['float_model'])}</h3>"
                     f"<p>Output metrics of each stage against the float model run without graph optimisations, "
                     f"{st['samples']} sample(s); the last row compares the integer kernels with the fake-quant "
                     "simulation.</p>")
        parts.append(_table(st["rows"], ["stage", *st["metrics"], "description"], "stages"))
    if m.get("remedies"):
        parts.append("<h3>Remedy searches</h3><p>The cheapest set of nodes to remedy so that the model meets the "
                     "target on data the search did not choose on ('judged on'; 'judged' is the value there), "
                     "simulated on the calibration samples ('simulated', 'baseline'), and re-quantized with the "
                     "settings when the float model is known, by the quantizer that made the model "
                     "('re-quantized with').</p>")
        parts.append(_table([r["row"] for r in m["remedies"]],
                            ["remedy", "metric", "target", "judged on", "met", "nodes", "simulated", "judged",
                             "re-quantized", "re-quantized with", "baseline", "every candidate"], "remedies"))
        for r in m["remedies"]:
            parts.append(f'<pre class="remedy">{_e(r["summary"])}</pre>')
            if r.get("image"):
                parts.append(_figure(r["image"]))
    return parts


def told_apart(models):
    """Each model's label; where one file is checked under several keys (two contracts, one
    with its float model), what tells them apart: its data, its float model, its sample
    limit (two identical headings otherwise); a number where nothing does."""
    from collections import Counter

    groups = {}
    for m in models:
        groups.setdefault(m["label"], []).append(m)
    labels = []
    for m in models:
        same = groups[m["label"]]
        differs = lambda key: len({x.get(key) for x in same}) > 1  # noqa: E731
        parts = ([f"on {m.get('data')}"] if differs("data") else []) + (
            [f"float model {m['float_model']}" if m.get("float_model") else "no float model"]
            if differs("float_model") else []) + (
            [f"first {m['data_num']} samples" if m.get("data_num") else "every sample"] if differs("data_num") else [])
        labels.append(m["label"] + (f" ({', '.join(parts)})" if parts else ""))
    seen, count = Counter(), Counter(labels)
    out = []
    for label in labels:
        seen[label] += 1
        out.append(f"{label} ({seen[label]})" if count[label] > 1 else label)
    return out


def render(models, interrupted=False, stopped=None):
    """The page for ``models`` (merged payloads), failing models first; for an ``interrupted``
    run, a page that says so instead; ``stopped``: why the run stopped before its last test
    (-x, --maxfail, --sw), which the page says above its results."""
    if interrupted:
        return _page(["<h1>pytest-ptq report</h1><p class=\"v-failed\">This run was interrupted before its tests "
                      "finished (Ctrl-C, or a time limit's signal): no results are shown, since those it had would "
                      "read as a complete run. Run it again to the end.</p>"])
    models = [dict(m) for m in sorted(models, key=lambda m: (_ORDER[verdict(m)], m["label"], m["data"]))]
    for m, label in zip(models, told_apart(models)):
        m["label"] = label
    budget = IMAGE_BUDGET
    for m in models:  # failing models first, so they keep their figures
        dropped = 0
        # a remedy curve first: a test asked for it, the other figures come with every model
        m["remedies"] = [dict(r) for r in m.get("remedies", [])]
        for r in m["remedies"]:
            if r.get("image"):
                if len(r["image"]["png"]) <= budget:
                    budget -= len(r["image"]["png"])
                else:
                    r["image"] = None
                    dropped += 1
        kept = []
        for img in m["images"]:
            if len(img["png"]) <= budget:
                kept.append(img)
                budget -= len(img["png"])
        m["images_dropped"] = dropped + len(m["images"]) - len(kept)
        m["images"] = kept
    counts = {o: sum(verdict(m) == o for m in models) for o in _ORDER}
    summary = []
    for k, m in enumerate(models):
        v = verdict(m)
        value, what, cls = headline(m)
        outcomes = [t["outcome"] for t in m["tests"]]
        tally = ", ".join(f"{outcomes.count(o)} {o}" for o in ("failed", "error", "xfailed", "passed", "skipped")
                          if outcomes.count(o))
        d = m.get("diagnosis") or {}
        top = m["sensitivity"]["rows"][0]["node"] if m.get("sensitivity") and m["sensitivity"]["rows"] else ""
        fix = d["fixes"][0]["short"] if d.get("fixes") else ""
        figure = (f'<td class="num {cls}">{_e(fmt(float(value)))}</td>' if value is not None else "<td></td>")
        summary.append(f'<tr><td><a href="#model-{k}">{_w(m["label"])}</a></td><td class="v-{v}">{v}</td>'
                       f'<td>{_e(tally)}</td>{figure}<td>{_w(what)}</td><td>{_e(d.get("cause", ""))}</td>'
                       f"<td>{_w(fix)}</td><td>{_w(top)}</td></tr>")
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    failing = counts["failed"]
    expected = [m for m in models if any(t["outcome"] == "xfailed" for t in m["tests"])]
    body = [f"<h1>pytest-ptq report</h1><p>{len(models)} model(s): "
            f'<span class="v-{"failed" if failing else "passed"}">{failing} failing</span>, '
            + (f'<span class="v-xfailed">{counts["xfailed"]} failing as expected (xfail)</span>, '
               if counts["xfailed"] else "")
            + f'{counts["passed"]} passing' + (f", {counts['skipped']} skipped" if counts["skipped"] else "")
            + f"; generated {stamp}.</p>"]
    if stopped:  # without it a run cut short after its first failure read as a complete one
        body.append(f'<p class="v-failed">This run stopped before its last test ({_e(stopped)}): the models and tests '
                    "it did not reach are not in this report.</p>")
    if expected:
        items = []
        for m in expected:
            xfailed = [t for t in m["tests"] if t["outcome"] == "xfailed"]
            reasons = list(dict.fromkeys(t["xfail_reason"] for t in xfailed if t.get("xfail_reason")))
            items.append(f"<li>{_e(m['label'])} ({len(xfailed)} test(s)): "
                         f"{_e('; '.join(reasons) or 'no reason given')}</li>")
        body.append("<p>Expected failures (xfail), not counted as failures:</p>"
                    f"<ul class=\"xfails\">{''.join(items)}</ul>")
    if models:
        body.append(_scroll('<table class="summary"><thead><tr><th>model</th><th>verdict</th><th>tests</th>'
                            "<th>contract figure</th><th>measured on, threshold</th><th>cause</th><th>fix to try</th>"
                            "<th>most sensitive node</th></tr></thead>"
                            f"<tbody>{''.join(summary)}</tbody></table>"))
    else:
        body.append("<p>No test that uses pytest-ptq ran in this session.</p>")
    body += [_model_html(k, m) for k, m in enumerate(models)]
    return _page(body)


def _page(body):
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">" + GENERATOR +
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>pytest-ptq report</title><style>{_CSS}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def write_started(path):
    """The page a run writes before its first test: a run killed before its end (a time
    limit's SIGTERM or SIGKILL, which leave no chance to write) leaves it, not the page of an
    earlier run that would read as this one's."""
    started = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    page = _page(["<h1>pytest-ptq report</h1><p class=\"v-failed\">This run started at " + started + " and has not "
                  "written its results: it is still running, or it was stopped before its end (a time limit's "
                  "signal). Run it again to the end.</p>"])
    return guard.write_text(Path(path), page, atomic=True)


def write(path, models, interrupted=False, stopped=None):
    """Write the page atomically (see :func:`render`); returns the path."""
    return guard.write_text(Path(path), render(models, interrupted, stopped), atomic=True)


def foreign(path):
    """True when ``path`` holds something other than a pytest-ptq report (an empty file or
    none at all is not foreign): the report only ever replaces a report."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    # reports before the generator tag carry the title
    return bool(head.strip()) and GENERATOR.encode() not in head and b"<title>pytest-ptq report</title>" not in head

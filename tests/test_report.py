"""The session's HTML report: one page, failing models first, tables and embedded figures,
the same with and without xdist, and clean in a real browser."""

from __future__ import annotations

import base64
import html
import io
import json
import os
import shutil
import signal
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import onnx
import pytest
from PIL import Image

import builders
from pytest_ptq import report
from pytest_ptq.session import terminal_lines
from test_plugin import (activation_pairs, build_models, feeds_of, independent_sensitivity, keep_only, pooled_cosine,
                         plugin_args, run)

SUITE = """
import pytest

pytestmark = pytest.mark.ptq(data="calib")

@pytest.mark.ptq(model="model_pc.onnx")
def test_good(ptq):
    ptq.assert_outputs(0.5)

@pytest.mark.ptq(model="model.onnx")
def test_strict(ptq):
    ptq.assert_outputs(1.0)

@pytest.mark.ptq(model="model.onnx")
def test_loose(ptq):
    ptq.assert_outputs(0.5)
"""


class Page(HTMLParser):
    """Sections, tables (by class) and images of a report page."""

    def __init__(self, text):
        super().__init__()
        self.sections, self.summary, self._table, self._cell, self._heading = [], [], None, None, None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "section":
            self.sections.append({"class": attrs.get("class", ""), "title": "", "tables": {}, "images": []})
        elif tag == "h2":
            self._heading = []
        elif tag == "table":
            self._table = []
            if attrs.get("class") == "summary":
                self.summary = self._table
            elif self.sections:
                self.sections[-1]["tables"][attrs.get("class")] = self._table
        elif tag == "tr" and self._table is not None:
            self._table.append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "img" and self.sections:
            self.sections[-1]["images"].append(attrs["src"])

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self._table[-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "table":
            self._table = None
        elif tag == "h2":
            self.sections[-1]["title"] = " ".join("".join(self._heading).split())
            self._heading = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)
        if self._heading is not None:
            self._heading.append(data)


def rows(table):
    """A parsed table as dicts keyed by its header."""
    return [dict(zip(table[0], r)) for r in table[1:]]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    built = build_models(tmp_path_factory.mktemp("report_models"))
    root, feeds, ref, quant = built["root"], built["feeds"], built["ref"], built["quant"]
    sens = independent_sensitivity(root / "model.onnx", feeds, activation_pairs(root / "model.onnx"))
    return {"root": root, "cosine": pooled_cosine([r["prob"] for r in ref], [q["prob"] for q in quant]),
            "sensitivity": sens}


@pytest.fixture
def project(pytester, models):
    for name in ("model.onnx", "model_pc.onnx"):
        shutil.copy(models["root"] / name, pytester.path / name)
    shutil.copytree(models["root"] / "calib", pytester.path / "calib")
    pytester.makepyfile(test_suite=SUITE)
    return pytester


def make_report(project, *args):
    path = project.path / "out" / "report.html"
    result = run(project, "--ptq-report", "out/report.html", "--ptq-node-type", "activation", *args)
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines([f"*ptq report: {path}*"])
    return path


def test_report_failing_models_first_with_tables_and_images(project, models):
    path = make_report(project, "-p", "no:xdist")
    text = path.read_text()
    assert len(text) < 3 * 2**20
    page = Page(text)
    assert [s["title"] for s in page.sections] == ["model.onnx FAILED", "model_pc.onnx PASSED"]
    assert [r["model"] for r in rows(page.summary)] == ["model.onnx", "model_pc.onnx"]
    failed = page.sections[0]
    tests = {r["test"]: r["outcome"] for r in rows(failed["tables"]["tests"])}
    assert tests == {"test_suite.py::test_strict": "failed", "test_suite.py::test_loose": "passed"}
    outputs = rows(failed["tables"]["outputs"])
    assert float(outputs[0]["cosine-similarity"]) == pytest.approx(models["cosine"], abs=1e-6)
    assert "sqnr (dB)" in outputs[0]  # a figure in decibels says so
    sens = models["sensitivity"]
    table = rows(failed["tables"]["sensitivity"])
    assert table[0]["node"] == min(sens, key=sens.get)
    assert float(table[0]["cosine-similarity"]) == pytest.approx(min(sens.values()), abs=1e-6)
    assert len(table) == 10
    for section in page.sections:
        assert len(section["images"]) >= 1
        for src in section["images"]:
            assert src.startswith("data:image/png;base64,")
            png = base64.b64decode(src.split(",", 1)[1])
            with Image.open(io.BytesIO(png)) as img:
                img.verify()
            with Image.open(io.BytesIO(png)) as img:
                assert 200 < img.width <= report.MAX_WIDTH
                assert len(png) < 300_000


def test_xdist_workers_merge_into_the_same_report(project):
    def outline(path):
        page = Page(path.read_text())
        return [(s["title"], sorted(map(tuple, s["tables"]["tests"][1:])), len(s["images"]),
                 s["tables"]["sensitivity"][1][0]) for s in page.sections]

    single = outline(make_report(project, "-p", "no:xdist"))
    distributed = outline(make_report(project, "-n", "2"))
    assert distributed == single


def chromium():
    """The headless browser of the report test: Debian's chromium (.ci/run installs it). In CI
    its absence fails the test: a skipped browser test checks nothing."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        if os.environ.get("CI"):
            pytest.fail("no chromium in CI: .ci/run installs it with `apt-get install -y chromium`")
        pytest.skip("no chromium installed (apt-get install -y chromium)")
    return browser


def run_chromium(browser, profile, *args):
    return subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
         f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", "--window-size=1280,900", *args],
        capture_output=True, text=True, timeout=180)


# Appended to a copy of the page (the report itself has no script): after load, every figure's
# decoded size, and where the failing model's cause and fix sit, written into the DOM.
PROBE = """<script>
window.addEventListener("load", () => {
  const imgs = [...document.images].map(i => [i.complete, i.naturalWidth, i.naturalHeight]);
  const box = sel => { const e = document.querySelector(sel); if (!e) return null;
    const r = e.getBoundingClientRect(), st = getComputedStyle(e);
    return [r.top + scrollY, r.height, st.display, st.visibility, e.textContent]; };
  const out = document.createElement("pre"); out.id = "probe";
  out.textContent = JSON.stringify({imgs, cause: box("section .why .cause"), fix: box("section .why ol.fixes"),
                                    why: box("section .why h3"), height: innerHeight,
                                    scroll: [document.documentElement.scrollWidth, innerWidth]});
  document.body.appendChild(out);
});
</script>"""


def test_report_opens_in_headless_chromium(project, tmp_path):
    browser = chromium()
    path = make_report(project)
    proc = run_chromium(browser, tmp_path / "profile", "--dump-dom", path.as_uri())
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = Page(proc.stdout)
    assert [s["title"] for s in dom.sections] == ["model.onnx FAILED", "model_pc.onnx PASSED"]
    console = [line for line in proc.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert console == []

    # the figures decode, and the failing model's cause and fix are on the page's first screens
    probed = tmp_path / "probed.html"
    probed.write_text(path.read_text().replace("</body>", PROBE + "</body>"))
    proc = run_chromium(browser, tmp_path / "profile", "--virtual-time-budget=10000", "--dump-dom", probed.as_uri())
    assert proc.returncode == 0, proc.stderr[-2000:]
    probe = json.loads(html.unescape(proc.stdout.split('<pre id="probe">', 1)[1].split("</pre>", 1)[0]))
    assert len(probe["imgs"]) == sum(len(s["images"]) for s in dom.sections) >= 2
    for complete, width, height in probe["imgs"]:
        assert complete and 200 < width <= report.MAX_WIDTH and height > 100
    top, height, display, visibility, text = probe["cause"]
    assert display != "none" and visibility == "visible" and height > 0
    assert top < 2 * probe["height"], "the cause of the failing model is not on its first screens"
    assert text.startswith("cause: ") and any(w in text for w in ("weights", "activations", "neither"))
    assert probe["why"][4] == "Why it fails" and probe["fix"] is not None and probe["fix"][1] > 0
    assert probe["scroll"][0] <= probe["scroll"][1], "the page scrolls sideways at 1280 px"
    # the search it suggests aims at the failing check's threshold (1.0), not the passing one's
    assert "ptq-debug suggest model.onnx calib --target-cosine 1 --remedy mixed" in path.read_text()

    # a screenshot, kept for CI (PTQ_SCREENSHOT_DIR) and looked at by people
    shot = tmp_path / "report.png"
    proc = run_chromium(browser, tmp_path / "profile", f"--screenshot={shot}", "--window-size=1280,2400",
                        path.as_uri())
    assert proc.returncode == 0 and shot.exists(), proc.stderr[-2000:]
    with Image.open(shot) as img:
        assert img.size == (1280, 2400)
        colours = img.convert("RGB").resize((64, 120)).getcolors(64 * 120)
        assert len(colours) > 50  # text, tables and figures, not a blank page
    if os.environ.get("PTQ_SCREENSHOT_DIR"):
        target = Path(os.environ["PTQ_SCREENSHOT_DIR"])
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, target / "report.png")


def test_report_of_a_session_without_models(pytester):
    pytester.makepyfile("def test_plain(): pass")
    run(pytester, "--ptq-report", "r.html").assert_outcomes(passed=1)
    assert "No test that uses pytest-ptq ran in this session." in (pytester.path / "r.html").read_text()


def test_collect_only_leaves_a_report_as_it_was(project):
    """With --ptq-report in addopts, --collect-only replaced the last run's report with a page
    saying no test used the plugin, though its items were collected."""
    path = make_report(project, "-p", "no:xdist")
    before = path.read_text()
    run(project, "--ptq-report", "out/report.html", "--collect-only")
    assert path.read_text() == before


def test_a_run_stopped_at_its_first_failure_says_so_on_the_page(project):
    """-x stopped the run after the first failing test: the page read "1 model(s): 1 failing,
    0 passing" as if complete, the models it did not reach missing without a word."""
    result = run(project, "--ptq-report", "report.html", "-p", "no:xdist", "-x")
    result.assert_outcomes(passed=1, failed=1)
    text = (project.path / "report.html").read_text()
    assert "This run stopped before its last test (stopping after 1 failures)" in text
    full = run(project, "--ptq-report", "report.html", "-p", "no:xdist")
    full.assert_outcomes(passed=2, failed=1)
    assert "stopped before its last test" not in (project.path / "report.html").read_text()


def test_figures_past_the_budget_are_left_out(monkeypatch):
    png = "iVBORw0K" + "A" * 992  # base64 text of a PNG, as the report takes only
    models = [{"id": k, "label": f"m{k}.onnx", "data": "d", "tests": [{"nodeid": f"t{k}", "outcome": outcome,
                                                                      "results": [], "section": ""}],
               "outputs": [], "sensitivity": None, "notes": [], "images": [{"title": "x", "png": png}] * 3}
              for k, outcome in enumerate(["passed", "failed"])]
    monkeypatch.setattr(report, "IMAGE_BUDGET", 4500)
    page = Page(report.render(models))
    # the failing model comes first and keeps its three figures; the budget leaves one
    assert [(s["title"], len(s["images"])) for s in page.sections] == [("m1.onnx FAILED", 3),
                                                                       ("m0.onnx PASSED", 1)]
    assert "2 figure(s) left out to keep this page small." in report.render(models)


def test_one_model_file_on_other_data_is_told_apart():
    """Two contracts on one file and other data made two identical summary rows."""
    models = [{"id": k, "label": "m.onnx", "data": data, "tests": [{"nodeid": f"t{k}", "outcome": "passed",
                                                                  "results": [], "section": ""}],
               "outputs": [], "sensitivity": None, "notes": [], "images": []}
              for k, data in enumerate(["night", "day", "day"])]
    models.append(dict(models[0], id=3, label="other.onnx"))
    page = Page(report.render(models))
    assert [s["title"] for s in page.sections] == ["m.onnx (on day) (1) PASSED", "m.onnx (on day) (2) PASSED",
                                                   "m.onnx (on night) PASSED", "other.onnx PASSED"]
    # the same data, one contract with the float model: what differs is said, in the report and the terminal
    pair = [dict(models[1], id=k, float_model=f) for k, f in ((5, "float.onnx"), (6, None))]
    assert report.told_apart(pair) == ["m.onnx (float model float.onnx)", "m.onnx (no float model)"]
    for m in pair:
        m["tests"] = [dict(m["tests"][0], outcome="failed", checks=[])]
        m["diagnosis"] = {"lines": ["why"], "headline": "", "about": ""}
    heads = [text for kind, text in terminal_lines(pair) if kind == "sep" and "FAILED" in text]
    assert heads == ["ptq: m.onnx (float model float.onnx) FAILED: 1 of 1 test(s) failed",
                     "ptq: m.onnx (no float model) FAILED: 1 of 1 test(s) failed"]
    # a check's line names its kind once, where its sentence starts with it too
    pair[0]["tests"][0]["checks"] = [{"passed": False, "kind": "baseline", "headline": "baseline b.json does not exist"}]
    told = [text for kind, text in terminal_lines(pair[:1]) if kind == "error"]
    assert told == [f"  FAILED baseline b.json does not exist  [{pair[0]['tests'][0]['nodeid']}]"], told
    # a check_* then its assert_* on the same figures: one line
    pair[0]["tests"][0]["checks"] *= 2
    assert [text for kind, text in terminal_lines(pair[:1]) if kind == "error"] == told


# -- data checks, stages and remedies ---------------------------------------------------------
EXTRAS = """
import pytest

pytestmark = pytest.mark.ptq(model="model.onnx", data="calib", float_model="float.onnx")

def test_data(ptq):
    ptq.assert_data(max_severity="error")

def test_stages(ptq):
    ptq.assert_stages(min_cosine=0.9)

def test_remedy(ptq):
    ptq.suggest(target={target!r}).save("remedy.json")
"""


class ExtrasPage(Page):
    """A report page with each section's preformatted blocks and figure captions too."""

    def __init__(self, text):
        self._pre = self._caption = None
        super().__init__(text)

    def handle_starttag(self, tag, attrs):
        super().handle_starttag(tag, attrs)
        if tag == "section":
            self.sections[-1].update(pre=[], captions=[])
        elif tag == "pre":
            self._pre = []
        elif tag == "figcaption":
            self._caption = []

    def handle_endtag(self, tag):
        super().handle_endtag(tag)
        if tag == "pre" and self._pre is not None:
            self.sections[-1]["pre"].append("".join(self._pre))
            self._pre = None
        elif tag == "figcaption" and self._caption is not None:
            self.sections[-1]["captions"].append("".join(self._caption))
            self._caption = None

    def handle_data(self, data):
        super().handle_data(data)
        for buf in (self._pre, self._caption):
            if buf is not None:
                buf.append(data)


@pytest.fixture
def extras_project(pytester, models):
    for name in ("model.onnx", "float.onnx"):
        shutil.copy(models["root"] / name, pytester.path / name)
    shutil.copytree(models["root"] / "calib", pytester.path / "calib")
    # a target between the quantized model's cosine and 1, so that the search has work to do
    pytester.makepyfile(test_extras=EXTRAS.format(target=1 - (1 - models["cosine"]) / 10))
    return pytester


def _figure_png(section, caption_start):
    k = next(i for i, c in enumerate(section["captions"]) if c.startswith(caption_start))
    png = base64.b64decode(section["images"][k].split(",", 1)[1])
    with Image.open(io.BytesIO(png)) as img:
        return img.width, len(png)


def test_report_shows_data_checks_stages_and_remedies(extras_project, models):
    from test_plugin_extras import stage_outputs

    project = extras_project
    run(project, "--ptq-report", "report.html", "-p", "no:xdist").assert_outcomes(passed=3)
    text = (project.path / "report.html").read_text()
    assert len(text) < 3 * 2**20
    [section] = ExtrasPage(text).sections
    tables = section["tables"]

    # the data check: the one planted cause of this tiny set (4 files), and numpy's statistics
    files = sorted((project.path / "calib" / "x").glob("*.npy"))
    [finding] = rows(tables["findings"])
    assert (finding["severity"], finding["check"]) == ("warning", "count")
    assert finding["message"].startswith(f"{len(files)} sample(s)")
    [stats] = rows(tables["data-stats"])
    arr = np.stack([np.load(f) for f in files]).astype(np.float64)
    assert int(stats["samples"]) == len(files)
    for key, value in (("min", arr.min()), ("max", arr.max()), ("mean", arr.mean()), ("std", arr.std())):
        assert float(stats[key]) == pytest.approx(value, abs=1e-6)

    # the stages: plain onnxruntime sessions, computed here
    feeds = feeds_of({"x": [np.load(f) for f in files]})
    out = stage_outputs(models["root"] / "float.onnx", models["root"] / "model.onnx", feeds)
    stages = {r["stage"]: float(r["cosine-similarity"]) for r in rows(tables["stages"])}
    assert list(stages) == ["optimized-float", "fake-quant", "integer", "integer vs fake-quant"]
    for stage in ("optimized-float", "fake-quant", "integer"):
        assert stages[stage] == pytest.approx(pooled_cosine(out["reference"], out[stage]), abs=1e-6)
    assert stages["integer vs fake-quant"] == pytest.approx(pooled_cosine(out["fake-quant"], out["integer"]), abs=1e-6)

    # the remedy: the table's numbers are the search's, its value a rewired model's
    remedy = json.loads((project.path / "remedy.json").read_text())
    [row] = rows(tables["remedies"])
    assert (row["remedy"], row["met"], int(row["nodes"])) == ("float", "yes" if remedy["met"] else "no",
                                                             len(remedy["nodes"]))
    for column, key in (("target", "target"), ("simulated", "value"), ("baseline", "baseline")):
        assert float(row[column]) == pytest.approx(remedy[key], abs=1e-6)
    assert float(row["re-quantized"]) == pytest.approx(remedy["measured"]["value"], abs=1e-6)
    model = models["root"] / "model.onnx"
    pairs = [n.name for n in onnx.load(str(model)).graph.node if n.op_type == "QuantizeLinear"]
    ref = [r["prob"] for r in builders.run_model(keep_only(model), feeds)]
    fixed = builders.run_model(keep_only(model, set(pairs) - set(remedy["nodes"])), feeds)
    assert float(row["simulated"]) == pytest.approx(pooled_cosine(ref, [g["prob"] for g in fixed]), abs=1e-6)
    [summary] = [p for p in section["pre"] if "nodes_to_exclude=" in p]
    assert "nodes_to_exclude=" + json.dumps(remedy["settings"]["nodes_to_exclude"]) in summary
    assert all(f"  {n}\n" in summary for n in remedy["nodes"])
    width, size = _figure_png(section, "Remedy search (float)")
    assert 200 < width <= report.MAX_WIDTH and size < 100_000


def test_xdist_report_keeps_what_each_worker_computed(extras_project):
    run(extras_project, "--ptq-report", "report.html", "-n", "2").assert_outcomes(passed=3)
    [section] = ExtrasPage((extras_project.path / "report.html").read_text()).sections
    assert {"findings", "data-stats", "stages", "remedies"} <= set(section["tables"])
    assert len(rows(section["tables"]["remedies"])) == 1
    assert sum(c.startswith("Remedy search") for c in section["captions"]) == 1


def test_merge_unites_data_checks_stages_and_remedies_once_each():
    def payload(**fields):
        base = {"id": "m", "label": "m.onnx", "data": "d", "tests": [], "outputs": [], "sensitivity": None,
                "images": [], "notes": [], "data_checks": [], "stages": [], "remedies": []}
        return {**base, **fields}

    check, stage = {"key": "data|None", "findings": []}, {"key": "stages|f.onnx", "rows": []}
    remedies = [{"key": f"remedy|float|cosine-similarity|{t}|prob", "row": {"target": t}} for t in (0.99, 0.999)]
    [merged] = report.merge([payload(data_checks=[check], remedies=remedies[:1]),
                             payload(data_checks=[check], stages=[stage], remedies=remedies)])
    assert merged["data_checks"] == [check] and merged["stages"] == [stage] and merged["remedies"] == remedies


def test_merge_takes_the_diagnosis_and_what_follows_it_from_the_worker_that_has_it():
    """Under --dist loadfile a model's failing items ran on a worker that finished second: the
    merged entry kept the first worker's, without its diagnosis, cause and figures."""
    def payload(**fields):
        base = {"id": "m", "label": "m.onnx", "data": "d", "tests": [], "outputs": [{"output": "prob"}],
                "notes": [], "data_checks": [], "stages": [], "remedies": [], "diagnosis": None}
        return {**base, **fields}

    passing = payload(tests=[{"nodeid": "a", "outcome": "passed"}], sensitivity={"node_type": "activation"},
                      images=[{"title": "curves"}])
    failing = payload(tests=[{"nodeid": "b", "outcome": "failed"}], diagnosis={"cause": "weight"},
                      sensitivity={"node_type": "weight"}, images=[{"title": "curves"}, {"title": "weight"}])
    for order in ([passing, failing], [failing, passing]):
        [merged] = report.merge(order)
        assert merged["diagnosis"] == {"cause": "weight"} and merged["sensitivity"] == {"node_type": "weight"}
        assert merged["images"] == failing["images"] and {t["nodeid"] for t in merged["tests"]} == {"a", "b"}


def test_merge_keeps_the_diagnosis_made_with_the_most_results(monkeypatch):
    """--dist loadgroup put a model's nodes item on one worker and its outputs item on another:
    both explained it, and the first to arrive stood, without the output check's floor and
    held-out figures had it been the nodes worker's. The one made beside an output check
    stands, in the report and in the terminal."""
    from pytest_ptq.session import merge_terminal

    def payload(nodeid, evidence, cause):
        return {"id": "m", "label": "m.onnx", "data": "d", "tests": [{"nodeid": nodeid, "outcome": "failed",
                                                                          "checks": []}],
                "outputs": [], "notes": [], "data_checks": [], "stages": [], "remedies": [], "warnings": [],
                "diagnosis": {"cause": cause}, "evidence": evidence, "suggest": [[cause, "cmd"]]}

    nodes_only, with_outputs = payload("n", [0, 1], "weight"), payload("o", [1, 1], "both")
    for order in ([nodes_only, with_outputs], [with_outputs, nodes_only]):
        [merged] = report.merge([dict(p) for p in order])
        assert merged["diagnosis"] == {"cause": "both"} and merged["suggest"] == [["both", "cmd"]]
        [merged] = merge_terminal([[dict(p)] for p in order])
        assert merged["diagnosis"] == {"cause": "both"} and {t["nodeid"] for t in merged["tests"]} == {"n", "o"}


def test_a_remedy_curve_is_kept_before_the_other_figures(monkeypatch):
    png = "iVBORw0K" + "A" * 992
    model = {"id": "m", "label": "m.onnx", "data": "d", "notes": [], "outputs": [], "sensitivity": None,
             "tests": [{"nodeid": "t", "outcome": "passed", "results": [], "section": ""}],
             "images": [{"title": "curves", "png": png}] * 2,
             "remedies": [{"key": "r", "row": {"remedy": "float"}, "summary": "s", "settings": {},
                           "image": {"title": "Remedy search (float)", "png": png}}]}
    monkeypatch.setattr(report, "IMAGE_BUDGET", 2500)
    text = report.render([model])
    [section] = ExtrasPage(text).sections
    assert section["captions"] == ["Remedy search (float)", "curves"]
    assert "1 figure(s) left out to keep this page small." in text
    assert model["remedies"][0]["image"] is not None  # the caller's payload is left as it was


XFAIL_SUITE = """
import pytest

@pytest.mark.xfail(strict=True, reason="naive quantization falls short")
@pytest.mark.ptq(model="model.onnx", data="calib")
def test_expected_to_fail(ptq):
    ptq.assert_outputs(0.99999999)
"""


def test_a_model_whose_failures_are_expected_reads_xfailed(project):
    project.makepyfile(test_suite=XFAIL_SUITE)
    result = run(project, "--ptq-report", "out/report.html", "-p", "no:xdist")
    result.assert_outcomes(xfailed=1)
    page = Page((project.path / "out" / "report.html").read_text())
    assert [s["title"] for s in page.sections] == ["model.onnx XFAILED"]
    assert [r["verdict"] for r in rows(page.summary)] == ["xfailed"]
    tests = {r["test"]: r["outcome"] for r in rows(page.sections[0]["tables"]["tests"])}
    assert tests == {"test_suite.py::test_expected_to_fail": "xfailed"}


def test_an_expected_failure_beside_a_real_one_is_marked_so_in_why_it_fails(project):
    project.makepyfile(test_suite=XFAIL_SUITE + """
@pytest.mark.ptq(model="model.onnx", data="calib")
def test_real_failure(ptq):
    ptq.assert_outputs(0.99999999)
""")
    result = run(project, "--ptq-report", "out/report.html", "-p", "no:xdist")
    result.assert_outcomes(xfailed=1, failed=1)
    page = Page((project.path / "out" / "report.html").read_text())
    [row] = [r for r in rows(page.sections[0]["tables"]["measures"]) if r["check"] == "outputs"]
    assert row["result"] == "FAIL" and row["test"] == ("test_suite.py::test_expected_to_fail (xfail), "
                                                       "test_suite.py::test_real_failure"), row


ERROR_SUITE = """
import pytest

def broken(run, data):
    raise ValueError("my metric broke")

@pytest.mark.ptq(model="model.onnx", data="calib")
def test_user_code_fails(ptq):
    ptq.assert_accuracy(broken)

@pytest.mark.ptq(model="model_pc.onnx", data="calib")
def test_no_baseline(ptq):
    ptq.assert_baseline("missing.json")
"""


def test_failures_no_check_measured_are_said_and_not_diagnosed(project):
    """An error in the user's code and a missing baseline are no model's accuracy failing: the
    report says what each failed with, and neither model is diagnosed."""
    project.makepyfile(test_suite=ERROR_SUITE)
    result = run(project, "--ptq-report", "out/report.html", "-p", "no:xdist")
    result.assert_outcomes(failed=2)
    assert "why the models fail" not in result.stdout.str()  # each failure's own text says it
    text = (project.path / "out" / "report.html").read_text()
    page = Page(text)
    assert sorted(s["title"] for s in page.sections) == ["model.onnx FAILED", "model_pc.onnx FAILED"]
    assert text.count("ValueError: my metric broke") == 2  # its test row and its model's box
    assert 'class="cause"' not in text and "Fix to try" not in text


def test_a_warning_on_one_model_file_is_printed_once():
    """Contracts on one model file with other data analyse it apart; its warning is one line."""
    from pytest_ptq.session import terminal_lines

    warned = {"text": "weights are stored already quantized", "fix": ""}
    models = [{"id": k, "label": "m.onnx", "tests": [{"nodeid": f"t{k}", "outcome": "passed"}],
               "warnings": [warned]} for k in range(3)]
    models.append({"id": 3, "label": "other.onnx", "tests": [], "warnings": [warned]})
    assert [text for kind, text in terminal_lines(models) if kind == "warning"] == [
        "warning: m.onnx: weights are stored already quantized",
        "warning: other.onnx: weights are stored already quantized"]


# -- long names, wide tables ------------------------------------------------------------------
LONG = ("/model/encoder/layers.99/self_attn/q_proj/very_long_submodule_name_generated_by_the_exporter/"
        "attention_scores/scaled_dot_product/tail/Mul_end_b_output_0_QuantizeLinear")
ASCII_TABLE = "+" + "-" * 170 + "+\n| node" + " " * 166 + "|\n| " + LONG + " " * (169 - len(LONG)) + "|\n"


def _long_named_models():
    """A failing model named by long paths, whose node check names a 150-character node and
    whose data check two tests make alike."""
    data = {"what": "findings at or above warning", "value": 2, "bound": "<=", "threshold": 0,
            "on": "/tmp/survey/awk/calib", "passed": False}
    nodes = {"what": f"cosine-similarity with only {LONG} quantized", "value": 0.949064, "bound": ">=",
             "threshold": 0.999, "on": "", "passed": False}
    tests = [{"nodeid": "awk.ptq.yaml::data_check", "outcome": "failed", "section": "",
              "results": [{"kind": "data", "passed": False, "summary": "2 finding(s)", "details": "",
                           "measures": [data]}]},
             {"nodeid": "test_stages.py::test_awk_stages", "outcome": "failed", "section": "",
              "results": [{"kind": "data", "passed": False, "summary": "2 finding(s)", "details": "",
                           "measures": [dict(data)]}]},
             {"nodeid": "awk.ptq.yaml::nodes", "outcome": "failed", "section": "",
              "results": [{"kind": "nodes", "passed": False, "summary": f"{LONG} (0.949064) is too sensitive",
                           "details": "most sensitive nodes:\n" + ASCII_TABLE, "measures": [nodes]}]}]
    return [{"id": 0, "label": "/tmp/survey_with_a_long_folder_name/awk/qdq_model_file.onnx", "data": "calib",
             "tests": tests, "outputs": [], "notes": [], "images": [],
             "sensitivity": {"metric": "cosine-similarity", "node_type": "activation", "nodes": 176,
                             "samples": 8, "rows": [{"node": LONG, "cosine-similarity": 0.949064}]}}]


def test_a_check_two_tests_make_alike_is_one_row_naming_both():
    """A contract's data_check and a test's assert_data on the same data made two rows of
    "data | findings at or above warning | 2" in "Why it fails"."""
    [m] = _long_named_models()
    rows = report.measures(m)
    data = [r for r in rows if r["check"] == "data"]
    assert len(data) == 1 and data[0]["test"] == "awk.ptq.yaml::data_check, test_stages.py::test_awk_stages"
    table = rows_of(Page(report.render([m])).sections[0]["tables"]["measures"])
    assert [r["check"] for r in table] == ["data", "nodes"] or [r["check"] for r in table] == ["nodes", "data"]


def rows_of(table):
    return [dict(zip(table[0], r)) for r in table[1:]]


def test_long_names_break_at_separators_and_tables_scroll_inside_the_page(tmp_path):
    """150-character node names with no break point pushed the tables off the right edge at
    800 px, ``overflow-wrap:anywhere`` squeezed the model column to a few characters, and the
    failure's ASCII table, in a pre-wrap block, wrapped into noise."""
    page = report.render(_long_named_models())
    broken = LONG.replace("/", "/<wbr>").replace(".", ".<wbr>").replace("_", "_<wbr>")
    assert broken in page
    assert "anywhere" not in page and "pre-wrap}" not in page.split("table.tests td pre", 1)[1].split("\n", 1)[0]
    # every table sits in a box that scrolls sideways
    assert page.count("<table") == page.count('<div class="scroll"><table') >= 3
    # the text reads the same: <wbr> adds no character
    parsed = Page(page)
    assert parsed.sections[0]["tables"]["sensitivity"][1][1] == LONG

    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        pytest.skip("no chromium installed to lay the page out")
    probe = """<script>
    window.addEventListener("load", () => {
      const first = document.querySelector("table.summary td").getBoundingClientRect().width;
      const pre = document.querySelector("table.tests td pre");
      const out = document.createElement("pre"); out.id = "probe";
      out.textContent = JSON.stringify({page: [document.documentElement.scrollWidth, innerWidth], first,
        pre: [getComputedStyle(pre).whiteSpace, pre.scrollWidth, pre.clientWidth, pre.getBoundingClientRect().height],
        boxes: [...document.querySelectorAll("div.scroll")].map(d => d.getBoundingClientRect().right)});
      document.body.appendChild(out);
    });
    </script>"""
    path = tmp_path / "page.html"
    path.write_text(page.replace("</body>", probe + "</body>"))
    proc = run_chromium(browser, tmp_path / "profile", "--window-size=800,2000", "--virtual-time-budget=5000",
                        "--dump-dom", path.as_uri())
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(html.unescape(proc.stdout.split('<pre id="probe">', 1)[1].split("</pre>", 1)[0]))
    width, inner = got["page"]
    assert width <= inner, "the page scrolls sideways at 800 px"
    assert all(right <= inner for right in got["boxes"])
    assert got["first"] >= 100, "the model column is squeezed"
    white, scroll, client, height = got["pre"]
    # the ASCII table keeps its lines (three of them, plus the heading) and scrolls instead
    assert white == "pre" and scroll > client and height < 8 * 16


def test_an_interrupted_run_writes_a_page_that_says_so(project):
    """After Ctrl-C the page held the models that had run and read as complete: a CI
    job stopped by its time limit published a green report (and drawing it kept the run going
    seconds after the signal)."""
    run(project, "--ptq-report=report.html").assert_outcomes(passed=2, failed=1)
    assert "1 passing" in (project.path / "report.html").read_text()
    project.makepyfile(test_zz_stop="""
        import pytest

        @pytest.mark.ptq(model="model.onnx", data="calib")
        def test_stop(ptq):
            ptq.assert_outputs(0.5)
            raise KeyboardInterrupt
    """)
    # a subprocess: in process, the interrupt would stop this session too
    result = project.runpytest_subprocess(*plugin_args(), "-p", "no:cacheprovider", "-p", "no:randomly",
                                          "--ptq-report=report.html", timeout=300)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    page = (project.path / "report.html").read_text()
    assert "This run was interrupted before its tests finished" in page and "passing" not in page
    result.stdout.fnmatch_lines(["*the ptq report '*report.html' says the run was interrupted, and holds no results"])


def test_ctrl_c_while_a_failure_is_explained_stops_the_run_blaming_no_plugin(project):
    """Ctrl-C during the minutes-long ranking of a failing test rose through every plugin
    wrapping the report hook, and pluggy warned that pytest-html had raised it."""
    project.makeconftest("""
        from pytest_ptq.session import PTQSession

        def explain(self, item):
            raise KeyboardInterrupt

        PTQSession.explain = explain
    """)
    project.makepyfile(test_zz_fails="""
        import pytest

        @pytest.mark.ptq(model="model.onnx", data="calib")
        def test_fails(ptq):
            ptq.assert_outputs(1.0)

        def test_never_run():
            raise AssertionError("the run stops before this test")
    """)
    result = project.runpytest_subprocess(*plugin_args(), "-p", "no:cacheprovider", "-p", "no:randomly",
                                          "test_zz_fails.py", "--html=h.html", "--ptq-report=report.html",
                                          timeout=300)
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.INTERRUPTED and "PluggyTeardownRaisedWarning" not in out, out
    assert "interrupted while explaining why test_zz_fails.py::test_fails failed" in out
    assert "test_never_run" not in out and "interrupted" in (project.path / "report.html").read_text()


def test_a_killed_run_leaves_a_page_that_says_it_did_not_finish(project):
    """A time limit's SIGTERM or SIGKILL leaves pytest no chance to write: the last complete
    run's page stayed, and read as this run's. The page a run writes as it starts stays."""
    run(project, "--ptq-report=report.html").assert_outcomes(passed=2, failed=1)
    assert "1 passing" in (project.path / "report.html").read_text()
    project.makepyfile(test_zz_killed="""
        import os
        import signal

        def test_killed():
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    result = project.runpytest_subprocess(*plugin_args(), "-p", "no:cacheprovider", "-p", "no:randomly",
                                          "--ptq-report=report.html", timeout=300)
    assert result.ret == -signal.SIGKILL
    page = (project.path / "report.html").read_text()
    assert "has not written its results" in page and "passing" not in page


def test_help_markers_collect_only_and_fixtures_keep_the_last_page(project):
    """They run no test: the page saying a run has not finished is written as a session
    starts, not as pytest configures (--help and --markers configure and end); --fixtures
    rewrote the page with no results at its end, and --collect-only said "ptq report:" of a
    page it kept."""
    run(project, "--ptq-report=report.html").assert_outcomes(passed=2, failed=1)
    page = (project.path / "report.html").read_text()
    for args in (["--help"], ["--markers"], ["--collect-only"], ["--fixtures"]):
        result = run(project, "--ptq-report=report.html", *args)
        assert (project.path / "report.html").read_text() == page, args
        assert "ptq report:" not in result.stdout.str(), args  # it said it wrote the page it kept


def test_a_box_plot_keeps_its_width_and_scrolls(tmp_path):
    """Shrunk to the page's width, a box plot of 64 channels a row had labels 4 pixels high:
    it keeps up to WIDE_WIDTH pixels, in a box that scrolls sideways."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(16.6, 4), dpi=100)
    fig.savefig(tmp_path / "wide.png")
    plt.close(fig)
    for wide, width in ((True, 1660), (False, report.MAX_WIDTH)):
        img = report._image(tmp_path / "wide.png", "t", wide=wide)
        with Image.open(io.BytesIO(base64.b64decode(img["png"]))) as png:
            assert png.width == width
        assert ('<div class="scroll"><img' in report._figure(img)) == wide


# pytest-rerunfailures' protocol, in short: a failed attempt's reports say "rerun", and each
# attempt ends with its own logfinish
RERUN_ONCE = """
import pytest
from _pytest.runner import runtestprotocol


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    for attempt in (1, 2):
        item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        reports = runtestprotocol(item, nextitem=nextitem, log=False)
        again = attempt == 1 and any(r.failed for r in reports)
        for r in reports:
            if again and r.failed:
                r.outcome = "rerun"
            item.ihook.pytest_runtest_logreport(report=r)
        item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        if not again:
            return True
    return True
"""


def test_a_test_run_again_is_reported_by_its_last_attempt(project):
    """With pytest-rerunfailures the first attempt's end freed the model and kept its report
    data with the test marked passed: the terminal said FAILED, the report passed."""
    project.makeconftest(RERUN_ONCE)
    # the failing test last of its model's: its first attempt's end was the model's end
    loose_first = SUITE.split("@pytest.mark.ptq(model=\"model.onnx\")")
    project.makepyfile(test_suite=loose_first[0] + "@pytest.mark.ptq(model=\"model.onnx\")" + loose_first[2]
                       + "@pytest.mark.ptq(model=\"model.onnx\")" + loose_first[1])
    result = run(project, "--ptq-report", "report.html", "-p", "no:xdist", "--ptq-node-type", "activation")
    outcomes = result.parseoutcomes()  # with "warnings" where the inner run has some
    assert {k: outcomes.get(k) for k in ("passed", "failed", "rerun")} == {"passed": 2, "failed": 1, "rerun": 1}
    page = Page((project.path / "report.html").read_text())
    assert [s["title"] for s in page.sections] == ["model.onnx FAILED", "model_pc.onnx PASSED"]
    tests = {r["test"]: r["outcome"] for r in rows(page.sections[0]["tables"]["tests"])}
    assert tests == {"test_suite.py::test_strict": "failed", "test_suite.py::test_loose": "passed"}


TIME_LIMIT_IN_DIAGNOSIS = """
import pytest
import pytest_ptq.analysis as analysis

_diagnosis, _in_test = analysis.Analysis.diagnosis, []


def _late(*args, **kwargs):
    if _in_test:  # pytest-timeout's limit covers a test's whole protocol, report hooks included
        pytest.fail("Timeout >2.0s")  # what its signal method raises, wherever the code is
    return _diagnosis(*args, **kwargs)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _in_test.append(item)
    try:
        return (yield)
    finally:
        _in_test.clear()


def pytest_configure(config):
    analysis.Analysis.diagnosis = _late


def pytest_unconfigure(config):
    analysis.Analysis.diagnosis = _diagnosis
"""


def test_a_time_limit_ending_in_a_diagnosis_fails_the_test_not_the_session(project):
    """pytest-timeout's limit ending while a failing test's models were diagnosed (in a report
    hook) was an INTERNALERROR: the session ended, no later test ran."""
    project.makeconftest(TIME_LIMIT_IN_DIAGNOSIS)
    result = run(project, "--ptq-report", "report.html", "-p", "no:xdist", "--ptq-node-type", "activation")
    result.assert_outcomes(passed=2, failed=1)
    assert "INTERNALERROR" not in result.stdout.str()
    result.stdout.fnmatch_lines(["*no diagnosis: the test's time limit (pytest-timeout) ended while it was computed*"])
    assert (project.path / "report.html").is_file()


def test_a_figure_two_ranked_nodes_share_is_drawn_once_and_named_twice(models):
    """The naive detector's report drew the distribution of a pair twice: as the input the
    2nd-ranked operator's 'why' is about, and as the 3rd-ranked node itself. It is drawn once,
    its title naming both, and an operator whose input was drawn above says so."""
    from pytest_ptq.analysis import Analysis, AnalysisKey

    root = models["root"]
    analysis = Analysis(AnalysisKey(str(root / "model.onnx"), str(root / "calib")), root)
    sens = analysis.sensitivity("node")
    qm = analysis.qmodel
    conv2 = next(n for n in qm.normal.values() if n.name == "conv2")
    act = next(c for c in conv2.calibration_inputs if qm.calibration[c].kind == "activation")
    top = ["conv2", act] + [n for n in list(sens)[:3] if n != "conv2"][:1]
    images, failure = report._distribution_figures(analysis, _Ranking(sens, top), "cosine-similarity",
                                                   top, {"conv2": act, top[2]: act}, [])
    assert failure is None
    titles = [i["title"] for i in images]
    assert sum(t.startswith(f"Distribution of {act}") for t in titles) == 1, titles
    shared = next(t for t in titles if t.startswith(f"Distribution of {act}"))
    assert "input of conv2 that its 'why' is about" in shared and "; also sensitivity rank 2: " in shared
    third = next(t for t in titles if t.startswith(f"Distribution of {top[2]} "))
    assert third.endswith(f"; its 'why' is about {act}, whose distribution is shown above")
    assert len({i["png"] for i in images}) == len(images)


class _Ranking(dict):
    """``top`` ranked in that order, with ``sens``' values (a pair it lacks reads 0.5)."""

    def __init__(self, sens, top):
        super().__init__({n: sens[n] if n in sens else {"cosine-similarity": 0.5} for n in top})
        self.samples = sens.samples


def test_a_wrapped_warning_keeps_its_command_on_one_line():
    """The summary wraps its warnings; a command in backticks was cut over two lines, and a
    copy from a CI log no longer ran. A cause starting with a minus keeps its indent."""
    from pytest_ptq.tables import warning_lines

    command = "ptq-debug stages models/det_float.onnx models/det_qdq.onnx data/calibration_images"
    lines = warning_lines("the file runs otherwise\n-1.5 dB on a path that goes on and on and on and on and on",
                          f"measure it (`{command}`) first", "warning: m.onnx: ", width=60)
    assert any(f"`{command}`" in x for x in lines), lines
    assert all(len(x) <= 60 for x in lines if "`" not in x), lines
    cause = [x for x in lines if x.startswith("  - -1.5")]
    assert cause and lines[lines.index(cause[0]) + 1].startswith(" " * 8 + "on"), lines



def test_a_node_or_output_named_like_a_non_finite_number_stays_a_name():
    """json_safe writes a non-finite figure as "inf" or "nan": a node named so was drawn as a
    number (a right-aligned 'inf' in monospace), where a figure of "inf" must still be one."""
    tests = [{"nodeid": "t", "outcome": "failed", "results": [], "section": ""}]
    model = {"id": 0, "label": "m.onnx", "data": "d", "tests": tests, "notes": [], "images": [],
             "outputs": [{"output": "nan", "cosine-similarity": "nan"}],
             "sensitivity": {"metric": "cosine-similarity", "node_type": "node", "nodes": 1, "samples": 2,
                             "rows": [{"node": "inf", "op_type": "Conv", "cosine-similarity": "-inf"}]}}
    html = report.render([model])
    assert '<td class="c-node">inf</td>' in html and '<td class="num">-inf</td>' in html, html
    assert '<td class="c-output">nan</td>' in html and '<td class="num">nan</td>' in html, html

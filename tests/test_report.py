"""The session's HTML report: one page, failing models first, tables and embedded figures,
the same with and without xdist, and clean in a real browser."""

from __future__ import annotations

import base64
import io
import shutil
import subprocess
from html.parser import HTMLParser

import pytest
from PIL import Image

import builders
from pytest_ptq import report
from test_plugin import N, activation_pairs, feeds_of, independent_sensitivity, keep_only, pooled_cosine, run

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
    root = tmp_path_factory.mktemp("report_models")
    float_path = builders.conv_net(root / "float.onnx")
    data = builders.samples(N)
    builders.save_folder(data, root / "calib")
    builders.quantize(float_path, root / "model.onnx", data)
    builders.quantize(float_path, root / "model_pc.onnx", data, per_channel=True)
    feeds = feeds_of(data)
    ref = builders.run_model(keep_only(root / "model.onnx"), feeds)
    quant = builders.run_model(root / "model.onnx", feeds)
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


def test_report_opens_in_headless_chromium(project, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        pytest.skip("no chromium installed")
    path = make_report(project)
    proc = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
         "--dump-dom", path.as_uri()],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = Page(proc.stdout)
    assert [s["title"] for s in dom.sections] == ["model.onnx FAILED", "model_pc.onnx PASSED"]
    console = [line for line in proc.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert console == []


def test_report_of_a_session_without_models(pytester):
    pytester.makepyfile("def test_plain(): pass")
    run(pytester, "--ptq-report", "r.html").assert_outcomes(passed=1)
    assert "No test used a ptq fixture or contract in this session." in (pytester.path / "r.html").read_text()


def test_figures_past_the_budget_are_left_out(monkeypatch):
    png = "A" * 1000
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

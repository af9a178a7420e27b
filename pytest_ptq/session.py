"""The plugin's state for one pytest session: analyses, per-test results, the report.

One :class:`PTQSession` lives in ``config.stash``. It builds each :class:`Analysis` once
(per xdist worker) and shares it with every test on that model; it records each check's
result for the test's failure section, JUnit properties and pytest-html extras; at the
end it turns what it saw into the JSON-safe payload of the HTML report. Under xdist each
worker sends its payload through ``config.workeroutput`` and the controller, which runs
no test, merges them and writes the page.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import pytest

from . import guard
from .errors import PTQError
from .settings import PTQPathWarning, apply_marker, below, from_config
from .tables import format_table

WORKER_KEY = "ptq_report"
# What a worker's tests read, so that the controller never writes the report onto it.
WORKER_INPUTS = "ptq_inputs"


@dataclasses.dataclass
class Record:
    """What one test did with models: which it used, its check results, its outcome."""

    nodeid: str
    models: list = dataclasses.field(default_factory=list)  # AnalysisKey.id, first use first
    results: list = dataclasses.field(default_factory=list)  # (AnalysisKey.id, Result)
    outcome: str = "passed"
    section: str = ""


class PTQSession:
    """Everything the plugin keeps for one session; hooks and fixtures delegate here."""

    def __init__(self, config):
        self.config = config
        self.root = Path(config.rootpath)
        self.settings = from_config(config)
        self.analyses = {}  # AnalysisKey.id -> Analysis
        self.tests = {}  # node id -> Record
        self.worker_payloads = []
        self.worker_inputs = []  # [path, what] read by the workers' tests
        self.is_worker = hasattr(config, "workerinput")
        self.report_error = None  # why the report was not written, as one sentence
        if not self.is_worker:  # the controller checks once; its workers write no report
            self._check_outputs()

    # -- outputs, checked before any test runs -----------------------------------------------
    def inputs(self):
        """What the session's own options name as inputs (model, data, float model, held-out
        data), as :class:`~pytest_ptq.guard.Inputs`."""
        s = self.settings
        return (guard.Inputs().add(s.model, "model file").add(s.data, "calibration data")
                .add(s.float_model, "float model").add(s.holdout, "held-out data"))

    def _check_outputs(self):
        """--ptq-report and --ptq-baseline-dir against the inputs, before any work; a path
        outside the rootdir is legal but gets a warning. Raises PTQError (a usage error)."""
        s, inputs = self.settings, self.inputs()
        if s.report is not None:
            self._report_path(inputs)
            self._warn_outside_root("report", "--ptq-report", s.report)
        default_dir = self.root / "ptq_baselines"
        if s.baseline_dir is not None and Path(s.baseline_dir) != default_dir:
            guard.output_path(s.baseline_dir, "--ptq-baseline-dir", inputs, folder=True,
                              writable=s.update != "none")
            self._warn_outside_root("baseline folder", "--ptq-baseline-dir", s.baseline_dir)
        if s.cache_dir is not None and not self.config.getoption("ptq_no_cache"):
            guard.output_path(s.cache_dir, "--ptq-cache-dir", inputs, folder=True)
            if self.config.getoption("cacheclear", False):
                from . import cache

                cache.clear(s.cache_dir)
        if s.baseline_dir is not None:
            # a killed update leaves temporary files; remove them before anyone commits them
            for folder, _dirs, _files in os.walk(s.baseline_dir):
                guard.clean_stale_temps(folder)

    def _report_path(self, inputs):
        from . import report as html_report

        path = guard.output_path(self.settings.report, "--ptq-report", inputs, atomic=True)
        if html_report.foreign(path):
            raise PTQError(f"--ptq-report {str(path)!r} exists and is not a pytest-ptq report; remove it or "
                           "choose another file name, such as ptq-report.html")
        return path

    def _warn_outside_root(self, what, option, path):
        if not below(path, self.root):
            self.config.issue_config_time_warning(PTQPathWarning(
                f"{option}: the {what} {str(path)!r} lies outside the rootdir {str(self.root)!r}, so it is not "
                "kept with the project; move it under the rootdir unless that is intended"), stacklevel=2)

    # -- analyses and settings -------------------------------------------------------------
    def analysis(self, model, data, float_model=None, data_num=None, custom_op_library=None):
        """The shared :class:`Analysis` of a model and its data (paths made absolute)."""
        if model is None:
            raise PTQError("no model to analyse: pass --ptq-model PATH, set ptq_model in "
                           "[tool.pytest.ini_options], or mark the test @pytest.mark.ptq(model=...)")
        if data is None:
            raise PTQError("no calibration data: pass --ptq-data PATH, set ptq_data in "
                           "[tool.pytest.ini_options], or mark the test @pytest.mark.ptq(data=...)")
        from .analysis import Analysis, AnalysisKey  # onnx and onnxruntime load on first use

        key = AnalysisKey(str(Path(model).resolve()), str(Path(data).resolve()),
                          str(Path(float_model).resolve()) if float_model else None,
                          int(data_num) if data_num else None,
                          str(Path(custom_op_library).resolve()) if custom_op_library else None)
        if key.id not in self.analyses:
            self.analyses[key.id] = Analysis(key, self.root, cache_dir=self.cache_dir())
        return self.analyses[key.id]

    def cache_dir(self):
        """Where results are kept between runs: --ptq-cache-dir, else ``d/ptq`` under pytest's
        cache dir (which --cache-clear empties); None with --ptq-no-cache or without pytest's
        cache plugin (``-p no:cacheprovider``)."""
        if self.config.getoption("ptq_no_cache"):
            return None
        if self.settings.cache_dir is not None:
            return self.settings.cache_dir
        pytest_cache = getattr(self.config, "cache", None)
        return None if pytest_cache is None else pytest_cache.mkdir("ptq")

    def settings_for(self, item):
        """Session settings overridden by the item's ``ptq`` markers, closest last."""
        settings = self.settings
        base = Path(item.path).parent
        for mark in reversed(list(item.iter_markers("ptq"))):
            settings = apply_marker(settings, mark.args, mark.kwargs, base)
        return settings

    def baseline_path(self, item, settings):
        """Default baseline of a Python test, mirroring its node id under the baseline folder:
        ``tests/test_x.py::TestC::test_y[a]`` -> ``DIR/tests/test_x/TestC.test_y[a].json``."""
        file, _, rest = item.nodeid.partition("::")
        folder = Path(file).with_suffix("") if file.endswith(".py") else Path(file)
        # a test outside the rootdir must not write outside the baseline folder
        folder = Path(*[p if p not in ("..", ".", "/") else "_" for p in folder.parts])
        name = re.sub(r"[^A-Za-z0-9._\-\[\]=,]+", "_", rest.replace("::", ".")).strip("._") or "baseline"
        return Path(settings.baseline_dir) / folder / f"{name}.json"

    # -- per-test records ------------------------------------------------------------------
    def use(self, item, analysis):
        """Note that ``item`` works on ``analysis`` (for the report and the failure section)."""
        rec = self.tests.setdefault(item.nodeid, Record(item.nodeid))
        if analysis.key.id not in rec.models:
            rec.models.append(analysis.key.id)
            item.user_properties.append(("ptq.model", analysis.label))
        return rec

    def record(self, item, analysis, result):
        """Keep ``result`` for ``item``'s reports; headline figures go to JUnit properties."""
        self.use(item, analysis).results.append((analysis.key.id, result))
        # appended directly: record_property warns under xunit2, user_properties does not
        item.user_properties.extend(result.properties())

    def failure_section(self, item):
        """The ``ptq`` section of a failing test: its check results, the output metrics and
        the most sensitive nodes of each model it used."""
        rec = self.tests.get(item.nodeid)
        if rec is None or not rec.models:
            return None
        settings = self._settings_of(item)
        blocks = []
        for model_id in rec.models:
            analysis = self.analyses[model_id]
            lines = [f"model {analysis.label}, data {analysis.relative(analysis.key.data)}"]
            done = [f"{r.kind} {'ok' if r else 'FAILED'}" for mid, r in rec.results if mid == model_id]
            if done:
                lines[0] += f"; checks: {', '.join(done)}"
            try:
                lines.append(_outputs_table(analysis))
                sens = analysis.sensitivity(settings.node_type, settings.metric)
                kind = "nodes" if settings.node_type == "node" else f"{settings.node_type} nodes"
                lines.append(f"most sensitive {kind} ({settings.metric} at the outputs with only that node "
                             "quantized, worst first):")
                lines.append(sens.table(limit=settings.top))
            except PTQError as exc:
                lines.append(f"(no analysis: {exc})")
            blocks.append("\n".join(lines))
        rec.section = "\n\n".join(blocks)
        return rec.section

    def _settings_of(self, item):
        """The item's settings for reporting: a contract item carries its own (its node type
        and metric); a bad marker, already reported as the test's error, falls back."""
        if SETTINGS_KEY in item.stash:
            return item.stash[SETTINGS_KEY]
        try:
            return self.settings_for(item)
        except PTQError:
            return self.settings

    def logreport(self, report):
        """Track the outcome of each test that used a model: a failed call is ``failed``, a
        failed setup or teardown ``error`` (unless the call failed too), an expected failure
        ``xfailed``, then ``skipped``."""
        rec = self.tests.get(report.nodeid)
        if rec is None:
            return
        if hasattr(report, "wasxfail") and report.skipped:
            rec.outcome = "xfailed"
        elif report.failed:
            rec.outcome = "failed" if report.when == "call" or rec.outcome == "failed" else "error"
        elif report.skipped and rec.outcome == "passed":
            rec.outcome = "skipped"

    def html_extras(self, item, rep):
        """pytest-html extras: the check results, and on failure the ptq section and curves."""
        rec = self.tests.get(item.nodeid)
        if rec is None or not rec.models:
            return
        from pytest_html import extras

        from . import report as html_report

        extra = [extras.html(html_report.results_html([r.to_dict() for _, r in rec.results]))]
        if rep.failed and rec.section:
            extra.append(extras.text(rec.section, name="ptq"))
            for model_id in rec.models:
                analysis = self.analyses[model_id]
                try:
                    png = html_report.curves_png(analysis, self._settings_of(item))
                except PTQError:
                    continue
                extra.append(extras.png(png, name=f"ptq curves {analysis.label}"))
        rep.extras = list(getattr(rep, "extras", [])) + extra

    # -- the HTML report ---------------------------------------------------------------------
    def payload(self):
        """JSON-safe report data of every model this process analysed."""
        from . import report as html_report

        return html_report.collect(self)

    def finish(self):
        """At session end: a worker hands its payload over, anyone else writes the page."""
        if self.settings.report is None:
            return
        if self.is_worker:
            self.config.workeroutput[WORKER_KEY] = json.dumps(self.payload())
            self.config.workeroutput[WORKER_INPUTS] = json.dumps(
                [[i.given, i.what] for a in self.analyses.values() for i in a.inputs().items])
            return
        from . import report as html_report

        try:
            # tests may have read models no option named (markers, contracts): check those too;
            # any other existing file is refused by _report_path as not a report
            inputs = self.inputs()
            for analysis in self.analyses.values():
                inputs = inputs | analysis.inputs()
            for path, what in self.worker_inputs:
                inputs.add(path, what)
            path = self._report_path(inputs)
            models = self.payload()
            for payload in self.worker_payloads:
                models.extend(json.loads(payload))
            html_report.write(path, html_report.merge(models))
        except PTQError as exc:
            # the run's results stand: the missing page is an error line of the summary, not a crash
            self.report_error = f"the ptq report was not written: {exc}"

    def node_down(self, node):
        """xdist controller: keep a finished worker's payload."""
        output = getattr(node, "workeroutput", {})
        if output.get(WORKER_KEY):
            self.worker_payloads.append(output[WORKER_KEY])
        self.worker_inputs += json.loads(output.get(WORKER_INPUTS, "[]"))

    def terminal_summary(self, terminalreporter):
        """One line saying where the report went (on the process that wrote it)."""
        if self.settings.report is None or self.is_worker:
            return
        if self.report_error:
            terminalreporter.write_line(f"ERROR: {self.report_error}", red=True, bold=True)
        else:
            terminalreporter.write_sep("-", f"ptq report: {self.settings.report}")


def _outputs_table(analysis):
    metrics = ["cosine-similarity", "sqnr", "mre", "chebyshev"]
    values = analysis.output_metrics(None, metrics).values
    rows = [{"output": o, **v} for o, v in values.items()]
    return "output metrics, fully quantized vs float:\n" + format_table(rows, ["output"] + metrics)


def get(config):
    """The session object of ``config`` (created by the plugin at configure time)."""
    return config.stash[SESSION_KEY]


SESSION_KEY = pytest.StashKey[PTQSession]()
# The settings a contract item ran with (its metric, node type, thresholds), for its reports.
SETTINGS_KEY = pytest.StashKey["Settings"]()

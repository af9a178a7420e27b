"""The plugin's state for one pytest session: analyses, per-test results, the report.

One :class:`PTQSession` lives in ``config.stash``. It builds each :class:`Analysis` once
(per xdist worker) and shares it with every test on that model; it records each check's
result for the test's failure section, JUnit properties and pytest-html extras; at the
end it turns what it saw into the JSON-safe payload of the HTML report. Under xdist each
worker sends its payload through ``config.workeroutput`` and the controller, which runs
no test, merges them and writes the page.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shlex
from pathlib import Path

import pytest

from . import guard
from .errors import PTQError
from .settings import OPTIONS, PTQPathWarning, apply_marker, below, from_config, given_as
from .tables import SUMMARY_WIDTH, printable, threshold_text, warning_lines

WORKER_KEY = "ptq_report"
# What a worker's tests read, so that the controller never writes the report onto it.
WORKER_INPUTS = "ptq_inputs"
# Each model's checks, diagnosis and warnings, for the controller's terminal summary.
WORKER_TERMINAL = "ptq_terminal"
# Options that a printed command drops or adds itself.
UPDATE_FLAGS = ("--ptq-update-baseline", "--ptq-update-all")
# Options writing the session's reports: a printed command reruns a test or two, and with
# them would overwrite the whole run's report with a page of those ({option: takes a value})
REPORT_FLAGS = {"--ptq-report": True, "--junitxml": True, "--junit-xml": True, "--html": True,
                "--self-contained-html": False, "--report-log": True, "--json-report-file": True}
# Failed checks whose cause is the quantization itself: a diagnosis explains them. A missing
# baseline or a data finding is explained by its own sentence.
DIAGNOSED = ("outputs", "nodes", "accuracy", "stages")


@dataclasses.dataclass
class Record:
    """What one test did with models: which it used, its check results, its outcome."""

    nodeid: str
    models: list = dataclasses.field(default_factory=list)  # AnalysisKey.id, first use first
    results: list = dataclasses.field(default_factory=list)  # (AnalysisKey.id, Result)
    outcome: str = "passed"
    section: str = ""
    xfail_reason: str = ""  # why its failure is expected (the xfail marker's reason)
    reason: str = ""  # what it failed with, where no check failed: the exception's first line
    diagnosed: bool = False  # its failure was a check's or an assert's: its models are diagnosed
    rerun: bool = False  # this attempt failed and runs again (pytest-rerunfailures): not done yet


class PTQSession:
    """Everything the plugin keeps for one session; hooks and fixtures delegate here."""

    def __init__(self, config):
        self.config = config
        self.root = Path(config.rootpath)
        self.settings = from_config(config)
        self.analyses = {}  # AnalysisKey.id -> Analysis
        self.tests = {}  # node id -> Record
        self._baseline_owners = {}  # default baseline path -> the node id that compared with it first
        self.baselines_written = {}  # resolved path -> "created" or "rewritten": this run's, failing again
        self.worker_payloads = []
        self.worker_inputs = []  # [path, what] read by the workers' tests
        self.worker_terminal = []  # the workers' terminal payloads (JSON text)
        self.diagnoses = {}  # AnalysisKey.id -> the lines explaining why it fails, computed once
        self.explained_with = {}  # AnalysisKey.id -> the settings its diagnosis used (the report's too)
        self.pending = None  # model path -> node ids still to run (see plan), or None: never release
        self.early = {}  # AnalysisKey.id -> (test count, report payload) of a model whose tests all ran
        self.interrupted = False  # Ctrl-C or SIGTERM stopped the run: see interrupt
        self.is_worker = hasattr(config, "workerinput")
        self.report_error = None  # why the report was not written, as one sentence
        self._pytest_cache_dir = ...  # the result cache under pytest's cache dir: decided on first use
        self._cache_read_only = False  # a --ptq-cache-dir it cannot write: read, nothing added
        self._cache_off = False  # ... and --cache-clear asked to empty it: not read either
        self._terminal = None  # where progress lines go (see _progress_stream)
        if not self.is_worker:  # the controller checks once; its workers write no report
            self._check_outputs()
        elif self.settings.cache_dir is not None:  # a worker writes results: it must know it cannot
            self._cache_modes(lambda text: None)

    # -- outputs, checked before any test runs -----------------------------------------------
    def inputs(self):
        """What the session's own options name as inputs (model, data, float model, held-out
        data), as :class:`~pytest_ptq.guard.Inputs`."""
        s = self.settings
        return (guard.Inputs().add(s.model, guard.MODEL_FILE).add(s.data, "calibration data")
                .add(s.float_model, guard.FLOAT_MODEL).add(s.holdout, "held-out data"))

    def _check_outputs(self):
        """--ptq-report and --ptq-baseline-dir against the inputs, before any work; a baseline
        folder outside the rootdir is legal but gets a warning (a report is an artifact: it
        may go anywhere). Raises PTQError (a usage error)."""
        s, inputs = self.settings, self.inputs()
        self._warn_rootdir_moved()
        if s.report is not None:
            self._report_path(inputs)
        default_dir = self.root / "ptq_baselines"
        if s.baseline_dir is not None and Path(s.baseline_dir) != default_dir:
            guard.output_path(s.baseline_dir, given_as(self.config, "baseline_dir"), inputs, folder=True,
                              writable=s.update != "none")
            self._warn_outside_root("baseline folder", given_as(self.config, "baseline_dir"), s.baseline_dir)
        if s.cache_dir is not None and not self.config.getoption("ptq_no_cache"):
            from . import cache

            # never an input or inside one, and a folder: usage errors; one it cannot write only
            # costs the time results save, as pytest's own cache dir does
            guard.output_path(s.cache_dir, given_as(self.config, "cache_dir"), inputs, folder=True, writable=False)
            self._cache_modes(self._cache_warning)
            if not self._cache_read_only and self.config.getoption("cacheclear", False):
                cache.clear(s.cache_dir)
        if s.baseline_dir is not None:
            # a killed update leaves temporary files; remove them before anyone commits them
            for folder, _dirs, _files in os.walk(s.baseline_dir):
                guard.clean_stale_temps(folder)

    @property
    def runs_tests(self):
        """False under --collect-only and --fixtures, which run no test: an existing page stays."""
        return not (self.config.getoption("collectonly", False) or self.config.getoption("showfixtures", False))

    def start(self):
        """A session starts (not --help or --markers, which configure and end): the last run's
        page gives way to one saying this run has not written its results, so that a run
        killed where nothing can be written (SIGTERM, SIGKILL) leaves no earlier page that
        reads as its own. --collect-only and --fixtures run no test: an existing page stays."""
        if self.is_worker or self.settings.report is None or not self.runs_tests:
            return
        from . import report as html_report

        # a page it cannot write now is said at the end, where the results are
        with contextlib.suppress(PTQError):
            html_report.write_started(self._report_path(self.inputs()))

    def _report_path(self, inputs):
        from . import report as html_report

        given = given_as(self.config, "report")
        path = guard.output_path(self.settings.report, given, inputs, atomic=True)
        if html_report.foreign(path):
            raise PTQError(f"{given} {str(path)!r} exists and is not a pytest-ptq report; remove it or "
                           "choose another file name, such as ptq-report.html")
        return path

    def _warn_rootdir_moved(self):
        """pytest takes an option's value given after a space for a path to test as well: a
        model or data outside the folder it starts in moved the rootdir up to their common
        parent, and the baselines with it. Said where that is what happened."""
        cfg = self.config
        start = Path(cfg.invocation_params.dir)
        if cfg.inipath is not None or cfg.getoption("rootdir", None) or Path(self.root).resolve() == start.resolve():
            return
        args = [str(a) for a in cfg.invocation_params.args]
        paths = {f for o in OPTIONS if o.is_path for f in o.flags}
        moved = [(flag, value) for flag, value in zip(args, args[1:])
                 if flag in paths and (start / value).exists() and not below(start / value, start)]
        if moved:
            given = ", ".join(f"{flag} {value}" for flag, value in moved)
            ini = next((start / n for n in ("pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg")
                        if (start / n).is_file()), None)
            unread = (f", and read no ini file (not {str(ini)!r}: its ptq_ keys and baseline folder are not in force)"
                      if ini is not None else "")
            self._config_warning(PTQPathWarning(
                f"{given}: pytest read {'the value as a path' if len(moved) == 1 else 'their values as paths'} to test too and "
                f"moved the rootdir to {str(self.root)!r}, where baselines and relative outputs now go{unread}; write "
                f"{' '.join(f'{flag}={value}' for flag, value in moved)}, or pin the rootdir (--rootdir, or an ini "
                "file)"))

    def _warn_outside_root(self, what, option, path):
        if not below(path, self.root):
            self._config_warning(PTQPathWarning(
                f"{option}: the {what} {str(path)!r} lies outside the rootdir {str(self.root)!r}, so it is not "
                "kept with the project; move it under the rootdir unless that is intended"))

    def _config_warning(self, warning):
        """A warning at start-up; where warnings are errors (``-W error``, ``filterwarnings =
        error``) pytest would raise it as an internal error: a usage error says it instead."""
        try:
            self.config.issue_config_time_warning(warning, stacklevel=3)
        except PTQPathWarning as exc:
            raise PTQError(f"{exc} (warnings are errors in this run)") from None

    def _cache_modes(self, warn):
        """A --ptq-cache-dir it cannot write is read (``warn(text)`` says so), unless
        --cache-clear asked to empty it: then it is not read either."""
        from . import cache

        if self.config.getoption("ptq_no_cache"):
            return
        clear = self.config.getoption("cacheclear", False)
        self._cache_read_only = not cache.writable(
            self.settings.cache_dir, "--ptq-cache-dir / ptq_cache_dir", warn,
            *(["--cache-clear cannot empty it, so those kept there are not read either"] if clear else []))
        self._cache_off = self._cache_read_only and clear

    def _cache_warning(self, text):
        """A start-up warning that results are not kept: shown, never raised (keeping them only
        saves time; see cache.warn_not_kept)."""
        from .cache import PTQCacheWarning, warn_not_kept

        try:
            self.config.issue_config_time_warning(PTQCacheWarning(text), stacklevel=3)
        except PTQCacheWarning:  # pytest applies -W error itself: said on standard error instead
            warn_not_kept(text)

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
            if not self.analyses and self.is_worker:
                from .engine import runtime
                from .spread import CORES_KEY

                # no folder from a controller without this plugin: no sharing of spare cores
                runtime.share_cores(self.config.workerinput.get("workercount", 1),
                                    self.config.workerinput.get(CORES_KEY))
            self.analyses[key.id] = Analysis(key, self.root, cache_dir=self.cache_dir(), memory=self.settings.memory,
                                             workers=self.settings.workers, progress=self._progress_stream(key),
                                             cache_read_only=self._cache_read_only)
        return self.analyses[key.id]

    def _progress_stream(self, key):
        """Where a model's long steps (its outputs, rankings, curves) say how far they are: the
        terminal, around pytest's capture, each line naming the model; None on an xdist worker
        (nothing shows its output) or under -q."""
        if self.is_worker or self.config.get_verbosity() < 0:
            return None
        if self._terminal is None:
            capman = self.config.pluginmanager.getplugin("capturemanager")
            terminal = self.config.pluginmanager.getplugin("terminalreporter")
            if capman is None or terminal is None:
                return None
            self._terminal = _Terminal(capman, terminal)
        return _TerminalLines(self._terminal, f"ptq {_shown_path(key.model, self.config.invocation_params.dir)}: ")

    def resume_terminal(self, report):
        """Before pytest writes a test's result (``report``): the status line progress lines
        cut, again."""
        if self._terminal is not None:
            self._terminal.resume(report)

    def cache_dir(self):
        """Where results are kept between runs: --ptq-cache-dir, else ``d/ptq`` under pytest's
        cache dir (which --cache-clear empties); None with --ptq-no-cache or without pytest's
        cache plugin (``-p no:cacheprovider``)."""
        if self.config.getoption("ptq_no_cache") or self._cache_off:
            return None
        if self.settings.cache_dir is not None:
            return self.settings.cache_dir
        if self._pytest_cache_dir is ...:  # decided once, said once
            self._pytest_cache_dir = None
            pytest_cache = getattr(self.config, "cache", None)
            if pytest_cache is not None:
                try:
                    self._pytest_cache_dir = pytest_cache.mkdir("ptq")
                except OSError as exc:  # a read-only checkout: pytest's own cache only warns too
                    from .cache import warn_not_kept

                    warn_not_kept(f"results are not kept between runs: pytest's cache dir takes no folder for them "
                                  f"({exc.strerror or exc}: {exc.filename}); pass --ptq-cache-dir DIR with a writable "
                                  "folder to keep them")
        return self._pytest_cache_dir

    def settings_for(self, item):
        """Session settings overridden by the item's ``ptq`` markers, closest last."""
        settings = self.settings
        base = Path(item.path).parent
        for mark in reversed(list(item.iter_markers("ptq"))):
            settings = apply_marker(settings, mark.args, mark.kwargs, base)
        return settings

    def baseline_path(self, item, settings):
        """Default baseline of a Python test, mirroring its node id under the baseline folder:
        ``tests/test_x.py::TestC::test_y[a]`` -> ``DIR/tests/test_x/TestC.test_y[a].json``.
        Claimed by the first test that asks: a second test mapped to the same file (ids that
        differ only in characters a file name cannot hold) is refused in one sentence."""
        file, _, rest = item.nodeid.partition("::")
        step = getattr(getattr(item, "callspec", None), "params", {}).get("__pytest_repeat_step_number")
        if isinstance(step, int):  # pytest-repeat's "[a-2-5]": every repetition compares with one baseline
            rest = re.sub(rf"(?:\[|-){step + 1}-\d+\]$", lambda m: "" if m.group(0)[0] == "[" else "]", rest)
        folder = Path(file).with_suffix("") if file.endswith(".py") else Path(file)
        # a test outside the rootdir must not write outside the baseline folder
        folder = Path(*[p if p not in ("..", ".", "/") else "_" for p in folder.parts])
        name = re.sub(r"[^A-Za-z0-9._\-\[\]=,]+", "_", rest.replace("::", ".")).strip("._") or "baseline"
        path = Path(settings.baseline_dir) / folder / f"{name}.json"
        test = f"{file}::{rest}"
        owner = self._baseline_owners.setdefault(path, test)
        if owner != test:  # one would compare with, or rewrite, the other's numbers
            shown = Path(os.path.relpath(path, self.root)).as_posix() if below(path, self.root) else path
            raise PTQError(f"tests {owner} and {test} share the default baseline file {shown} (their ids "
                           "differ only in characters a file name cannot hold); give one of them an id of its own "
                           "(pytest.param(..., id=...)) or a baseline path of its own (ptq.assert_baseline(path) "
                           "or a ptq marker's baseline=)")
        return path

    # -- per-test records ------------------------------------------------------------------
    def use(self, item, analysis):
        """Note that ``item`` works on ``analysis`` (for the report and the failure section)."""
        rec = self.tests.setdefault(item.nodeid, Record(item.nodeid))
        if analysis.key.id not in rec.models:
            rec.models.append(analysis.key.id)
            _add_properties(item, [("ptq.model", analysis.label)])
        return rec

    def record(self, item, analysis, result):
        """Keep ``result`` for ``item``'s reports; headline figures go to JUnit properties."""
        self.use(item, analysis).results.append((analysis.key.id, result))
        _add_properties(item, result.properties())

    # -- why a model fails ----------------------------------------------------------------
    def judged_on(self, model_id):
        """The held-out data the model's failing checks used (absolute path; of any check when
        none failed), or None when they ran on the calibration data: the data a verdict must be
        decided on (a nodes check judges calibration data, beside outputs passing on held-out)."""
        results = self._results_of(model_id)
        failing = [r for r in results if not r]
        return next((r.holdout for r in failing or results if getattr(r, "holdout", None)), None)

    def holdout_of(self, model_id):
        """The held-out data any of the model's checks used (absolute path), or None."""
        return next((r.holdout for r in self._results_of(model_id) if getattr(r, "holdout", None)), None)

    def _results_of(self, model_id):
        """The check results of the model's tests so far, in test order."""
        return [r for rec in self.tests.values() for mid, r in rec.results if mid == model_id]

    def evidence_of(self, model_id):
        """``[output and accuracy results, all results]`` this process holds of the model: under
        xdist, where a model's items ran on several workers (``--dist loadgroup``), each
        explains it from its own results, and the explanation with the most stands (one made
        beside the failing output check has its floors and held-out figures)."""
        results = self._results_of(model_id)
        return [sum(r.kind in ("outputs", "accuracy") for r in results), len(results)]

    def failing_outputs(self, model_id):
        """The output specs of the model whose output checks failed (an output, or a slice
        ``obj=output[:, :, 4:5]``), which the explanation and the remedy judge: a model's other
        outputs may be ones its contract holds to no floor that matters (a recurrent state
        beside the speech probability); None where no output check failed, or every output
        of the model failed whole (the default: the same)."""
        from .outputs import key_of

        # each as its check's key names it, which suggest reads back (default=default for a tensor 'default')
        failing = list(dict.fromkeys(r.parts.get(o) or o for r in self._results_of(model_id)
                                     if r.kind == "outputs" and not r for o in r.failing))
        if not failing or set(failing) == {key_of(o) for o in self.analyses[model_id].output_names}:
            return None
        return failing

    def explain(self, item):
        """After a failing (or expectedly failing) call: the diagnosis of each model the test
        used, computed once per model, kept for the terminal summary, the report and
        pytest-html; returns the text (also the record's ``section``)."""
        rec = self.tests.get(item.nodeid)
        if rec is None or not rec.models:
            return None
        failed = [r for _, r in rec.results if not r]
        if failed and not any(r.kind in DIAGNOSED or (r.kind == "baseline" and r.status == "degraded")
                              for r in failed):
            return None  # a missing baseline or a data finding: its own sentence says what to do
        rec.diagnosed = True
        settings = self._settings_of(item)
        for model_id in rec.models:
            ranked, by_nodes = self._ranked_in(model_id, settings)
            made = self.explained_with.get(model_id)
            if model_id not in self.diagnoses or by_nodes and (made.node_type, made.metric) != (
                    ranked.node_type, ranked.metric):
                self.diagnoses[model_id] = self._diagnose(model_id, ranked)
        rec.section = "\n\n".join(f"{self.analyses[m].label}:\n" + "\n".join(self.explanation(m)["lines"])
                                   for m in rec.models if m in self.diagnoses)
        return rec.section

    def _ranked_in(self, model_id, settings):
        """(settings, True) with the node type and metric of the model's failing nodes check,
        whose offenders the explanation's fix must reach (a check given them as arguments, a
        contract's beside a Python test), whichever test failed first; else (settings, False)."""
        r = next((r for r in self._results_of(model_id) if r.kind == "nodes" and not r), None)
        if r is None:
            return settings, False
        return dataclasses.replace(settings, node_type=r.node_type, metric=r.metric), True

    def explanation(self, model_id):
        """The diagnosis of ``model_id`` (None before a failure computed one) with the searches
        its failed checks ask for so far: a check failing after the diagnosis was made (a
        contract's accuracy item after its outputs item) has its own search."""
        d = self.diagnoses.get(model_id)
        if d is None or model_id not in self.explained_with:
            return d
        searches = self.suggest_commands(self.analyses[model_id], self.explained_with[model_id])
        return dict(d, lines=d["lines"] + [f"  the smallest set that meets {what}, searched and re-quantized "
                                           f"(minutes): {command}" for what, command in searches])

    def _diagnose(self, model_id, settings):
        analysis = self.analyses[model_id]
        self.explained_with[model_id] = settings
        try:
            d = analysis.diagnosis(settings.node_type, settings.metric, self.judged_on(model_id), settings.top,
                                   outputs=self.failing_outputs(model_id))
        except pytest.fail.Exception:
            # pytest-timeout's time limit ended in it: the test failed already; raised here, it
            # was an INTERNALERROR that ended the session
            return {"lines": ["(no diagnosis: the test's time limit (pytest-timeout) ended while it was computed; "
                               "raise the limit for this test, or run ptq-debug runall on the model)"],
                    "headline": "", "about": ""}
        except Exception as exc:  # noqa: BLE001 - an explanation that fails must not hide the test's result
            why = str(exc) if isinstance(exc, PTQError) else f"{type(exc).__name__}: {exc}"
            return {"lines": [f"(no diagnosis: {why})"], "headline": "", "about": ""}
        qm = analysis.qmodel
        held = analysis.data.count  # a contract's data_num keeps the first few of the samples there
        used = f"the first {analysis.samples} of {held}" if held > analysis.samples else f"{analysis.samples}"
        ranked = used if d.samples == analysis.samples and held > analysis.samples else f"{d.samples} of {used}"
        about = (f"{qm.format} model made by {d.producer}; ranked on {ranked} calibration "
                 f"sample(s) of {analysis.relative(analysis.key.data)}")
        lines = d.lines(settings.top, report=None if self.settings.report is None else self.settings.report.name)
        return {"lines": lines, "headline": d.headline(), "about": about}

    def suggest_commands(self, analysis, settings):
        """``[(what it meets, command)]``: ``ptq-debug suggest`` on the model with the contract's
        data, runnable from where pytest was started, for each kind of check that failed: the
        task score of a failing accuracy check whose function a file defines, then the output
        floors; none where both passed (a failing nodes check names its own offenders)."""
        from .remedy.terms import suggest_command  # where a model failed: the analyses are loaded

        key = analysis.key
        here = self.config.invocation_params.dir
        holdout = self.holdout_of(key.id)
        results = self._results_of(key.id)

        def command(heldout, objective, aimed=()):
            args = suggest_command(_shown_path(key.model, here), _shown_path(key.data, here),
                                   heldout and _shown_path(heldout, here),
                                   key.float_model and _shown_path(key.float_model, here), key.data_num)
            return shlex.join([*args, *objective, "--remedy", "mixed", *aimed])

        out = []
        # a search after the output floors may lose task accuracy (and did): the task's own
        # score is what its check asks of a remedy
        scored = next((r for r in results if r.kind == "accuracy" and not r and r.source), None)
        if scored is not None:
            file, _, name = scored.source.rpartition(":")
            out.append(("its accuracy check", command(scored.holdout or holdout, [
                "--evaluate", f"{_shown_path(file, here)}:{name}", "--min-ratio", threshold_text(scored.min_ratio)])))
        # the target: each output that failed at its own floor (the strictest where two checks
        # hold it), as the contract names it; a passing output's floor, or another output's
        # stricter one, would send the search after more than the contract asks
        checks = [r for r in results if r.kind == "outputs" and r.metric == "cosine-similarity" and r.thresholds]
        # no output check here (a nodes check alone failed, or -k left the outputs item out):
        # no floor of the contract's to aim at, and the nodes check names its own offenders
        ran_outputs = any(r.kind == "outputs" for r in results)
        if checks and all(checks) or not checks and (scored is not None or results and not ran_outputs):
            return out
        floors = {}
        for r in checks:
            for o in r.failing:
                named = r.parts.get(o) or o
                floors[named] = max(floors.get(named, r.thresholds[o]), r.thresholds[o])
        if len(set(floors.values())) > 1:  # the outputs the targets name are those searched
            out.append(("its output floors", command(holdout, ["--target-cosine", *(
                f"{o}={threshold_text(t)}" for o, t in floors.items())])))
            return out
        parts = self.failing_outputs(key.id)  # the search aims at the outputs (or slices) that failed
        out.append(("its output floors", command(holdout, ["--target-cosine", threshold_text(
            max(floors.values()) if floors else settings.min_cosine)], ["-o", *parts] if parts else [])))
        return out

    def warnings_of(self, analysis):
        """The engine's warnings of ``analysis`` as ``{text, fix}``, the fix's commands with the
        model's paths as this run names them; none before its engine is built."""
        from .diagnosis import warning

        key, here = analysis.key, self.config.invocation_params.dir
        stages = shlex.join(["ptq-debug", "stages", _shown_path(key.float_model, here) if key.float_model
                             else "FLOAT_MODEL", _shown_path(key.model, here), _shown_path(key.data, here)])
        few = self._few_samples(analysis)
        return [warning(w, stages) for w in analysis.warnings + ([few] if few else [])]

    def _few_samples(self, analysis):
        """A sentence where the model's output or accuracy checks judged it on fewer calibration
        samples than a calibration set should hold (:data:`~pytest_ptq.params.FEW_SAMPLES`)
        with no held-out data: a pass there says little of other data. None otherwise."""
        from .params import FEW_SAMPLES

        judged = [r for r in self._results_of(analysis.key.id) if r.kind in ("outputs", "accuracy")
                  and r.holdout is None and 0 < r.samples < FEW_SAMPLES]
        if not judged:
            return None
        kinds = " and ".join(dict.fromkeys(r.kind for r in judged))
        return (f"its {kinds} check(s) judged it on {min(r.samples for r in judged)} calibration sample(s) "
                f"({judged[0].data}) and no held-out data: a result on so few samples, which may be those it was "
                f"calibrated on, may not hold on other data; give the check held-out data ('holdout:' in a contract, "
                f"{FEW_SAMPLES} or more samples drawn like the deployment's)")

    # -- commands printed in messages -------------------------------------------------------
    def commands(self, item):
        """How to rerun ``item`` as this run did: ``{"update": ... --ptq-update-baseline,
        "rerun": ...}``, for the messages that suggest them."""
        return {"update": self.command(item, "--ptq-update-baseline"), "rerun": self.command(item)}

    def command(self, item=None, *extra):
        """This run's command line with ``extra`` options, runnable as printed from where
        pytest was started: its own options (``--ptq-model``, ``--ptq-data``, ``-p``, ...) but
        those writing reports (:data:`REPORT_FLAGS`), and
        for a test or contract file the item itself instead of the paths given; the built-in
        contract of ``--ptq-model`` keeps the paths given, as it has no file."""
        inv = self.config.invocation_params
        args = [str(a) for a in inv.args if str(a) not in UPDATE_FLAGS]
        # an option's value after a space is a path to test too as pytest finds the rootdir
        # (see _warn_rootdir_moved): the command prints it after '='
        valued, glued, k = {f for o in OPTIONS for f in o.flags}, [], 0
        while k < len(args):
            flag = args[k].partition("=")[0]
            if flag in REPORT_FLAGS:  # left out, with its value
                k += 2 if REPORT_FLAGS[flag] and "=" not in args[k] else 1
            elif args[k] in valued and k + 1 < len(args):
                glued.append(f"{args[k]}={args[k + 1]}")
                k += 2
            else:
                glued.append(args[k])
                k += 1
        args = glued
        if item is not None and not item.nodeid.startswith("ptq::"):
            given = {str(a) for a in self.config.args}
            args = [a for a in args if a not in given]
            _, sep, rest = item.nodeid.partition("::")
            args.append(_shown_path(item.path, inv.dir) + (sep + rest if sep else ""))
        return shlex.join(["pytest", *args, *extra])

    def _settings_of(self, item):
        """The item's settings for reporting: a contract item carries its own (its node type
        and metric); a bad marker, already reported as the test's error, falls back."""
        if SETTINGS_KEY in item.stash:
            return item.stash[SETTINGS_KEY]
        try:
            return self.settings_for(item)
        except PTQError:
            return self.settings

    def failed_with(self, item, exc):
        """Keep what a test using a model failed with (an input's sentence, an error in the
        user's code), for the report's rows where no check says it."""
        rec = self.tests.get(item.nodeid)
        if rec is None or rec.reason:
            return
        # the tool's sentences (an input failure is pytest's fail with one), a failed check or assert
        own = isinstance(exc, (PTQError, AssertionError)) or getattr(exc, "msg", None) is not None
        text = str(getattr(exc, "msg", None) or exc).strip()
        text = text.splitlines()[0] if text else ""
        rec.reason = text if own and text else f"{type(exc).__name__}: {text}".rstrip(": ")

    def logreport(self, report):
        """Track the outcome of each test that used a model: a failed call is ``failed``, a
        failed setup or teardown ``error`` (unless the call failed too), an expected failure
        ``xfailed``, then ``skipped``."""
        rec = self.tests.get(report.nodeid)
        if rec is None:
            return
        if report.outcome == "rerun":  # pytest-rerunfailures: the next attempt decides
            rec.rerun = True
            return
        if hasattr(report, "wasxfail") and report.skipped:
            rec.outcome = "xfailed"
            rec.xfail_reason = report.wasxfail
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
                except Exception:  # noqa: BLE001 - a missing plot must not hide the test's result
                    continue
                extra.append(extras.png(png, name=f"ptq curves {analysis.label}"))
        rep.extras = list(getattr(rep, "extras", [])) + extra

    # -- the HTML report ---------------------------------------------------------------------
    # -- a model's sessions freed once its tests ran ----------------------------------------
    def plan(self, models):
        """Collection done: ``models`` maps each selected item to the model path it checks.
        A model's engine is freed as soon as its last such item ran, so a suite's memory is
        about one model's, not the sum. An item whose model is only known when it
        runs (a fixture parametrised with its model) may use a freed model again, which then
        recompiles what it needs (its results are kept): a few seconds, against holding every
        model's sessions to the end (measured on the example suite, whose story tests are such
        items: 830 MiB held at the end). Not on xdist workers: a worker does not know which
        items it will still get."""
        if self.is_worker:
            return
        self.pending = {}
        for nodeid, model in models.items():
            self.pending.setdefault(str(Path(model).resolve()), set()).add(nodeid)

    def interrupt(self):
        """Ctrl-C or SIGTERM arrived where it could not end the run at once (while a failure was
        explained): the page will hold no results, so nothing is drawn for it from now on."""
        self.interrupted = True

    def test_done(self, nodeid):
        """An item finished: free the engines of the models no item left will use (after
        computing their report data, which needs them)."""
        rec = self.tests.get(nodeid)
        if rec is not None and rec.rerun:
            # the attempt that failed is forgotten, its models kept for the next one: the report
            # read the first attempt as the test's, and freed the models the rerun then needed
            self.tests[nodeid] = Record(nodeid)
            return
        if self.pending is None:
            return
        for model, left in list(self.pending.items()):
            left.discard(nodeid)
            if left:
                continue
            del self.pending[model]
            for analysis in self.analyses.values():
                if analysis.key.model == model:
                    # interrupted: the page holds no results, and drawing them redid the minutes
                    # of ranking the signal had just stopped
                    if self.settings.report is not None and not self.interrupted:
                        try:
                            self.early[analysis.key.id] = (self._tests_of(analysis), self._model_payload(analysis))
                        except pytest.fail.Exception:
                            # the test's time limit (pytest-timeout) ended while its figures were drawn:
                            # drawn at the session's end instead, the models kept for that
                            continue
                    analysis.release()

    def _tests_of(self, analysis):
        return sum(analysis.key.id in rec.models for rec in self.tests.values())

    def _model_payload(self, analysis):
        from . import report as html_report

        return html_report.payload_of(self, analysis)

    def report_payload(self, analysis):
        """The report data of ``analysis``: computed when its last test ran, unless a test
        used it since."""
        early = self.early.get(analysis.key.id)
        if early is not None and early[0] == self._tests_of(analysis):
            return early[1]
        return self._model_payload(analysis)

    def payload(self):
        """JSON-safe report data of every model this process analysed."""
        from . import report as html_report

        return html_report.collect(self)

    def terminal_payload(self):
        """JSON-safe terminal data of every model this process's tests used: each test's
        outcome and checks (the measured values beside their thresholds), the diagnosis when a
        failure computed one, and the engine's warnings."""
        models = {}
        for rec in self.tests.values():
            for model_id in rec.models:
                analysis = self.analyses[model_id]
                key = analysis.key
                m = models.setdefault(model_id, {"id": model_id, "label": analysis.label, "tests": [],
                                                 "data": analysis.relative(key.data), "data_num": key.data_num,
                                                 "float_model": analysis.relative(key.float_model)
                                                 if key.float_model else None,
                                                 "diagnosis": self.explanation(model_id),
                                                 "evidence": self.evidence_of(model_id),
                                                 "warnings": self.warnings_of(analysis)})
                m["tests"].append({"nodeid": rec.nodeid, "outcome": rec.outcome, "xfail_reason": rec.xfail_reason,
                                   "reason": rec.reason,
                                   "checks": [{"kind": r.kind, "passed": bool(r), "headline": r.headline()}
                                              for mid, r in rec.results if mid == model_id]})
        return list(models.values())

    def finish(self, interrupted=False, stopped=None):
        """At session end: a worker hands its payloads over, anyone else writes the page.
        ``interrupted`` (Ctrl-C, a CI timeout's signal): the page says so and holds no results,
        drawn nothing for (a partial page read as all passing, and drawing it kept the run
        alive seconds after the signal); ``stopped``: why the run ended before its last test
        (-x, --maxfail), which the page says. Under --collect-only and --fixtures nothing is
        written: an existing report stays."""
        if not self.runs_tests:
            return
        # an xdist worker stopped by an interrupt (see interrupt) ends its loop without pytest's
        # interrupted status: its payload, drawn in full, went to a page saying interrupted
        interrupted = interrupted or self.interrupted
        if self.is_worker:
            if self.analyses:  # its tests are done: the workers still running may take its cores
                from .engine import runtime

                runtime.leave()
            self.config.workeroutput[WORKER_TERMINAL] = json.dumps(self.terminal_payload())
        if self.settings.report is None:
            return
        if self.is_worker:
            self.config.workeroutput[WORKER_KEY] = json.dumps([] if interrupted else self.payload())
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
            if interrupted:
                html_report.write(path, [], interrupted=True)
                self.report_error = f"the ptq report {str(path)!r} says the run was interrupted, and holds no results"
                return
            models = self.payload()
            for payload in self.worker_payloads:
                models.extend(json.loads(payload))
            html_report.write(path, html_report.merge(models), stopped=stopped)
        except PTQError as exc:
            # the run's results stand: the missing page is an error line of the summary, not a crash
            self.report_error = f"the ptq report was not written: {exc}"
        except Exception as exc:  # noqa: BLE001 - the same for a fault of ours or a library's
            self.report_error = (f"the ptq report was not written: {type(exc).__name__}: {exc} (an internal error; "
                                 "please report it with this line)")

    def node_down(self, node):
        """xdist controller: keep a finished worker's payloads."""
        output = getattr(node, "workeroutput", {})
        if output.get(WORKER_KEY):
            self.worker_payloads.append(output[WORKER_KEY])
        if output.get(WORKER_TERMINAL):
            self.worker_terminal.append(output[WORKER_TERMINAL])
        self.worker_inputs += json.loads(output.get(WORKER_INPUTS, "[]"))

    def terminal_summary(self, terminalreporter):
        """Once per model: why each failing model fails (its checks against their thresholds,
        the cause, the nodes, the fix), the models expected to fail with their reasons, the
        warnings with their fixes; then where the report went."""
        if self.is_worker:
            return
        models = merge_terminal([self.terminal_payload()] + [json.loads(p) for p in self.worker_terminal])
        for kind, text in terminal_lines(models):
            # one line each: a name from the model holding a newline or an escape sequence would
            # start lines of its own in a CI log (a workflow command, a fake "3 passed")
            text = printable(text)
            if kind == "sep":
                terminalreporter.write_sep("_" if text.startswith("ptq: ") else "=", text)
            else:
                terminalreporter.write_line(text, red=kind == "error", yellow=kind == "warning")
        if self.settings.report is None or not self.runs_tests:  # no page written: none to point at
            return
        if self.report_error:
            terminalreporter.write_line(f"ERROR: {self.report_error}", red=True, bold=True)
        else:
            terminalreporter.write_sep("-", f"ptq report: {self.settings.report}")


# what XML 1.0 cannot hold (pytest's own set, DEL with it): pytest escapes a property's value
# but writes its name as given, and one control character in an output name made the whole
# junit.xml unreadable
_NOT_XML = re.compile("[^\u0009\u000a\u000d\u0020-\u007e\u0080-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _xml_name(name):
    """``name`` with each character XML cannot hold written ``#xNN``, as pytest writes them in values."""
    return _NOT_XML.sub(lambda m: f"#x{ord(m.group()):02X}", name)


def _add_properties(item, pairs):
    """Append one check's ``(name, value)`` pairs to ``item``'s JUnit properties. A check
    repeated in the test (names an earlier one took) gets ``#2``, ``#3``... on all its names:
    a reader keeping the last value of a name showed a failing check as the clean one after it,
    and one suffix for the whole check keeps its figures together."""
    pairs = [(_xml_name(name), value) for name, value in pairs]
    taken = {name for name, _ in item.user_properties}
    n, suffix = 1, ""
    while any(name + suffix in taken for name, _ in pairs):
        n += 1
        suffix = f"#{n}"
    # appended directly: record_property warns under xunit2, user_properties does not
    item.user_properties.extend((name + suffix, value) for name, value in pairs)


def merge_terminal(payloads):
    """One entry per model from several processes' terminal payloads, tests united."""
    merged = {}
    for payload in payloads:
        for m in payload:
            into = merged.setdefault(m["id"], dict(m, tests=[]))
            seen = {t["nodeid"] for t in into["tests"]}
            into["tests"] += [t for t in m["tests"] if t["nodeid"] not in seen]
            if m.get("diagnosis") and (not into.get("diagnosis") or m["evidence"] > into["evidence"]):
                into["diagnosis"], into["evidence"] = m["diagnosis"], m["evidence"]
            seen = {w["text"] for w in into.get("warnings", [])}
            into["warnings"] = list(into.get("warnings", [])) + [w for w in m.get("warnings", [])
                                                                 if w["text"] not in seen]
    return sorted(merged.values(), key=lambda m: m["label"])


def model_outcome(tests):
    """``failed`` when a test failed or errored, else ``passed``, ``xfailed``, ``skipped``."""
    outcomes = {t["outcome"] for t in tests}
    for o in ("failed", "error", "passed", "xfailed"):
        if o in outcomes:
            return "failed" if o == "error" else o
    return "skipped"


def terminal_lines(models):
    """``(kind, text)`` pairs of the terminal summary: ``sep`` headings, ``error``,
    ``warning`` and plain lines. A failing model's block comes once, whatever the number of
    its failing tests."""
    if not models:  # a run without models: report (and onnx behind it) stays unimported
        return []
    from .report import told_apart

    models = [dict(m, label=label, file=m["label"]) for m, label in zip(models, told_apart(models))]
    out = []
    # a model whose failures no diagnosis explains (a missing baseline, a data finding) has
    # said what to do in its failure sentences; repeating them here would bury them
    failing = [m for m in models if model_outcome(m["tests"]) == "failed" and m.get("diagnosis")]
    # expected failures, counted apart: any model with an xfailed test, whatever its others did
    expected = [m for m in models if any(t["outcome"] == "xfailed" for t in m["tests"])]
    warned = [m for m in models if m.get("warnings")]
    if not (failing or expected or warned):
        return out
    out.append(("sep", "ptq: why the models fail" if failing else "ptq"))
    for m in failing:
        tests = [t for t in m["tests"] if t["outcome"] in ("failed", "error")]
        passed = [t for t in m["tests"] if t["outcome"] == "passed"]
        out.append(("sep", f"ptq: {m['label']} FAILED: {len(tests)} of {len(m['tests'])} test(s) failed"))
        d = m.get("diagnosis") or {}
        if d.get("about"):
            out.append(("", d["about"]))
        for t in tests:
            # the checks of the failing tests: what each measured, beside its threshold (a
            # check_* then its assert_* on the same figures, once)
            seen = set()
            for c in t["checks"]:
                if (c["kind"], c["passed"], c["headline"]) in seen:
                    continue
                seen.add((c["kind"], c["passed"], c["headline"]))
                mark = "FAILED" if not c["passed"] else "ok"
                # a headline that starts with its kind ("baseline b.json does not exist") says it once
                said = c["headline"].removeprefix(f"{c['kind']} ")
                out.append(("error" if not c["passed"] else "", f"  {mark:6} {c['kind']:8} {said}  [{t['nodeid']}]"))
            if not any(not c["passed"] for c in t["checks"]):
                out.append(("error", f"  FAILED {t['nodeid']}: " + (t.get("reason") or
                                                                    "no ptq check failed; see its failure above")))
        if passed:
            names = ", ".join(t["nodeid"].rpartition("::")[2] or t["nodeid"] for t in passed[:4])
            out.append(("", f"  passed: {names}" + (f" and {len(passed) - 4} more" if len(passed) > 4 else "")))
        out += [("", line) for line in d.get("lines", [])]
    if expected:
        count = sum(t["outcome"] == "xfailed" for m in expected for t in m["tests"])
        out.append(("", f"{count} expected failure(s) (xfail) on {len(expected)} model(s), not counted as failures:"))
        for m in expected:
            xfailed = [t for t in m["tests"] if t["outcome"] == "xfailed"]
            reasons = list(dict.fromkeys(t["xfail_reason"] for t in xfailed if t["xfail_reason"]))
            why = f": {'; '.join(reasons)}" if reasons else ""
            head = (m.get("diagnosis") or {}).get("headline")
            out.append(("", f"  {m['label']} ({len(xfailed)} test(s)){why}" + (f"; {head}" if head else "")))
    # once per model file: its analyses on other data or float models warn alike (whole
    # warnings: a cause another file shares is still one of this file's)
    told = {}
    for m in warned:
        for w in m["warnings"]:
            told.setdefault((m["file"], w["text"], w["fix"]), None)
    return out + [("warning", line) for file, text, fix in told
                  for line in warning_lines(text, fix, f"warning: {file}: ", width=SUMMARY_WIDTH)]


def _shown_path(path, start):
    """``path`` as a command line names it from ``start``: relative when below it."""
    path = Path(path)
    try:
        return Path(os.path.relpath(path, start)).as_posix() if Path(path).resolve().is_relative_to(
            Path(start).resolve()) else path.as_posix()
    except ValueError:  # another drive on Windows
        return path.as_posix()


def get(config):
    """The session object of ``config`` (created by the plugin at configure time)."""
    return config.stash[SESSION_KEY]


SESSION_KEY = pytest.StashKey[PTQSession]()
# The settings a contract item ran with (its metric, node type, thresholds), for its reports.
SETTINGS_KEY = pytest.StashKey["Settings"]()


class _Terminal:
    """pytest's terminal, written to around its capture: progress lines each on a line of their
    own, and the status line they cut (a file's dots) started again before its next result."""

    def __init__(self, capman, terminal):
        self.capman, self.terminal = capman, terminal
        self.cut = None  # the status line the last lines cut, until resumed

    def write_lines(self, lines):
        t = self.terminal
        if isinstance(t.currentfspath, os.PathLike):  # the status line open now, the one cut
            self.cut = t.currentfspath  # (-v's per-test lines pytest starts again itself)
        with self.capman.global_and_fixture_disabled():
            for line in lines:
                t.write_line(line)

    def resume(self, report):
        """Before a test's result (``report``): the file's status line it belongs on, written
        again where no status line is open (pytest opens the next file's itself when its first
        item starts) and the result shows (a passed setup or teardown shows none)."""
        if self.cut is None or report.when != "call" and report.passed:
            return
        t, where, self.cut = self.terminal, self.cut, None
        if t.currentfspath is None:
            with self.capman.global_and_fixture_disabled():
                t.write(os.path.relpath(where, t.startpath) + " ")
            t.currentfspath = where


class _TerminalLines:
    """A text stream onto a :class:`_Terminal`, each complete line prefixed; no terminal
    drawing (``isatty`` False), so a progress bar prints a line per tenth."""

    def __init__(self, terminal, prefix):
        self.terminal, self.prefix = terminal, prefix
        self.pending = ""

    def write(self, text):
        *lines, self.pending = (self.pending + text).split("\n")
        if lines:
            self.terminal.write_lines([self.prefix + line for line in lines])

    def flush(self):  # complete lines are written as they come; a partial one waits for its end
        self.terminal.terminal.flush()

    def isatty(self):
        return False

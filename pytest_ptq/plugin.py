"""pytest-ptq as a pytest plugin (entry point ``pytest11: ptq``).

Options (``--ptq-*``, one group) and ini keys (``ptq_*``) are in ``settings.py``; the
fixtures are below; ``*.ptq.yaml`` contracts are collected by ``contract.py``, which also
holds the built-in contract that ``--ptq-model`` adds when no collected test uses the
plugin. Hooks only hand their work to the :class:`~pytest_ptq.session.PTQSession` of the run.

Fixtures: ``ptq_model`` and ``ptq_data`` (paths), ``ptq_analysis`` (the shared, cached
analysis of the test's model), ``ptq`` (the assertion helpers bound to the test),
``ptq_session`` and ``ptq_settings``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from . import contract as ptq_contract
from . import session as ptq_session_mod
from . import settings as ptq_settings_mod
from . import termination
from .errors import PTQError, as_sentence

# Only settings, metrics (and numpy), contracts and the session shell load with pytest: onnx,
# onnxruntime and matplotlib load when a test first uses a model, so a run without models
# pays numpy's import (about 0.1 s) and nothing more.
CONTRACT_SUFFIXES = ptq_contract.SUFFIXES
# A test asking for one of these writes its own checks: the built-in contract steps aside.
FIXTURES = ("ptq", "ptq_model", "ptq_data", "ptq_analysis", "ptq_settings", "ptq_session")


def pytest_addoption(parser):
    """Register the ``ptq`` option group and its ini keys."""
    ptq_settings_mod.add_options(parser)


def pytest_configure(config):
    """Register the marker and the session object; a bad ini value stops the run here."""
    config.addinivalue_line("markers", ptq_settings_mod.MARKER_HELP)
    try:
        ptq = ptq_session_mod.PTQSession(config)
    except PTQError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.stash[ptq_session_mod.SESSION_KEY] = ptq
    config.pluginmanager.register(_Hooks(ptq), "ptq-session-hooks")


def pytest_collect_file(file_path, parent):
    """Collect ``*.ptq.yaml`` contracts."""
    if file_path.name.endswith(CONTRACT_SUFFIXES):
        return ptq_contract.ContractFile.from_parent(parent, path=file_path)
    return None


class _Hooks:
    """Run-time hooks, bound to the run's session object."""

    def __init__(self, ptq):
        self.ptq = ptq
        self.groups_file = self.cores_folder = None  # xdist controller: see pytest_configure_node
        self.terminates = False  # SIGTERM raises: see pytest_sessionstart

    # tryfirst: -k, -m and --deselect then select the built-in contract's items like any other
    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, session, items):
        """Add the built-in contract of ``--ptq-model`` when no collected test uses the plugin."""
        if not any(_uses_plugin(item) for item in items):
            items.extend(_default_contract(session, self.ptq))

    # tryfirst: before xdist's worker sends the collection to the controller
    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_finish(self, session):
        """Which model each selected item checks: an xdist worker writes it for the controller
        (see ``spread``); the session frees a model's sessions once its items ran. Where an
        item checks a model, SIGTERM (a CI time limit) stops the run as Ctrl-C does until it
        ends, where nothing else handles that signal: pytest leaves it alone, and its default
        ran no clean-up (the temporary figures stayed, the page said the run had not
        finished); a suite that does not use the plugin keeps Python's default."""
        models = _models_of(session.items, self.ptq)
        if models or any(_uses_plugin(item) for item in session.items):
            self.terminates = termination.install()
        path = getattr(session.config, "workerinput", {}).get("ptq_groups_file")
        if path:
            from . import spread
            spread.write_groups(path, models)
        self.ptq.plan(models)

    def pytest_sessionstart(self, session):
        """The report's page says this run has not finished until it writes its results."""
        self.ptq.start()

    def pytest_runtest_logfinish(self, nodeid, location):
        """An item ran: free what no later item needs."""
        self.ptq.test_done(nodeid)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item, call):
        """A failing test's models are diagnosed (once each, for the terminal summary and the
        reports); pytest-html gets the figures as extras."""
        rep = yield
        if call.excinfo is not None and not call.excinfo.errisinstance(pytest.skip.Exception):
            self.ptq.failed_with(item, call.excinfo.value)
        # a failed check or assert is diagnosed; an input error (PTQError) is one sentence, and an
        # error in the user's code (an evaluation function that raises) is no model's failure
        if call.when == "call" and call.excinfo is not None and call.excinfo.errisinstance(AssertionError):
            try:
                self.ptq.explain(item)
            except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (termination.Terminated)
                # raised through this hook, every plugin wrapping it was blamed for it (pluggy
                # warned of pytest-html); the run stops as pytest stops it, after this report,
                # with pytest's interrupted status, and draws nothing for its page on the way out
                self.ptq.interrupt()
                item.session.shouldstop = f"interrupted while explaining why {item.nodeid} failed"
        # extras in the call phase: pytest-html drops what arrives in teardown
        if call.when == "call" and item.config.getoption("htmlpath", None):
            self.ptq.html_extras(item, rep)
        return rep

    @pytest.hookimpl(tryfirst=True)  # before the terminal writes the result (see resume_terminal)
    def pytest_runtest_logreport(self, report):
        """Track the outcome of tests that used a model."""
        self.ptq.resume_terminal(report)
        self.ptq.logreport(report)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus):
        """Write the HTML report (or, on an xdist worker, send its data)."""
        # session.shouldfail: -x, --maxfail or --sw stopped the run (a string saying so)
        stopped = session.shouldfail or session.shouldstop
        self.ptq.finish(interrupted=exitstatus == pytest.ExitCode.INTERRUPTED,
                        stopped=stopped if isinstance(stopped, str) else None)

    # outermost of the session's end (tryfirst): SIGTERM there, in any plugin's part, ended pytest
    # in a traceback through every hook wrapper
    @pytest.hookimpl(wrapper=True, tryfirst=True, specname="pytest_sessionfinish")
    def pytest_sessionfinish_terminated(self, session):  # a second pytest_sessionfinish (specname)
        """SIGTERM while the session ends: the page says the run was interrupted (its figures
        were what was being drawn), and one line says so on stderr, without a traceback."""
        try:
            return (yield)
        except termination.Terminated:
            self.ptq.finish(interrupted=True)
            session.exitstatus = pytest.ExitCode.INTERRUPTED
            writer = session.config.get_terminal_writer()
            writer.line()  # after the last test's progress
            writer.line(
                "pytest-ptq: terminated (SIGTERM) while the session ended; run it again to the end", red=True)
            return None

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node):
        """xdist controller: name the file where the workers say which model each item checks, and
        the folder where they say they run (see engine.runtime.share_cores)."""
        from . import spread
        if self.groups_file is None:  # the first worker: what killed runs left goes first
            spread.sweep_stale()
        self.groups_file = spread.groups_file(node.workerinput["testrunuid"])
        self.cores_folder = spread.cores_folder(node.workerinput["testrunuid"])
        node.workerinput[spread.WORKERINPUT_KEY] = str(self.groups_file)
        node.workerinput[spread.CORES_KEY] = str(self.cores_folder)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(self, config, log):
        """xdist controller: with the default ``--dist load``, a model's items go to one worker,
        which compiles its engine once; any other ``--dist`` is the user's choice."""
        if config.getoption("dist") != "load" or self.groups_file is None:
            return None
        from . import spread
        return spread.ModelScheduling(config, log, self.groups_file)

    def pytest_unconfigure(self, config):
        if self.terminates:
            termination.restore()
        if self.groups_file is not None:
            self.groups_file.unlink(missing_ok=True)
            import shutil

            shutil.rmtree(self.cores_folder, ignore_errors=True)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        """xdist controller: collect a worker's report data."""
        self.ptq.node_down(node)

    def pytest_terminal_summary(self, terminalreporter):
        """Why each failing model fails, once per model; warnings; where the report went."""
        self.ptq.terminal_summary(terminalreporter)


def _default_contract(session, ptq):
    """The collected items of the built-in contract of ``--ptq-model`` (ini ``ptq_model``):
    ``ptq::<model file>::outputs``, ``nodes`` and ``baseline``; none without a model or with
    ``--ptq-no-default-contract``. Without data its items fail saying so."""
    config = session.config
    if ptq.settings.model is None or config.getoption("ptq_no_default_contract"):
        return []
    if config.getoption("ptq_model") is None and config.args_source == pytest.Config.ArgsSource.ARGS:
        # the model comes from the ini and the command line names what to run (a file, a test):
        # `pytest tests/test_unit.py::test_unit` ran the built-in contract's three items too
        return []
    # through the session's own collection, so that collect reports, counts and errors
    # come out as for any collected file
    return list(session.genitems(ptq_contract.DefaultContracts.from_parent(
        session, name="ptq", nodeid="ptq", settings=ptq.settings)))


def _models_of(items, ptq):
    """``{node id: model path}`` of the items that check a model known at collection (a
    contract's, a ``ptq`` marker's or the session's); other items, and those whose model or
    data a parametrised fixture gives, are left out."""
    models = {}
    for item in items:
        model = getattr(getattr(item, "contract", None), "model", None)
        if model is None and _uses_plugin(item) and not _model_by_fixture(item):
            try:
                model = ptq.settings_for(item).model
            except PTQError:
                continue  # a bad marker: the test reports it
        if model is not None:
            models[item.nodeid] = str(model)
    return models


def _model_by_fixture(item):
    """An item whose model or data come from a parametrised fixture: known only when it runs."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    return any(name in params for name in ("ptq_model", "ptq_data"))


def _uses_plugin(item):
    """A contract check, a test marked ``ptq`` or one that asks for a ptq fixture."""
    return (item.path.name.endswith(CONTRACT_SUFFIXES) or item.get_closest_marker("ptq") is not None
            or any(name in FIXTURES for name in getattr(item, "fixturenames", ())))


def _fail(exc):
    __tracebackhide__ = True
    # from None: called while handling ``exc``, which pytest would print again as the context
    raise pytest.fail.Exception(str(exc), pytrace=False) from None


def _param_path(request, name):
    """An indirect parametrisation value as an absolute path (relative to the test module)."""
    value = getattr(request, "param", None)
    if value is None:
        return None
    path = Path(os.path.expanduser(str(value)))
    path = path if path.is_absolute() else Path(request.node.path).parent / path
    if not path.exists():
        _fail(PTQError(f"{name} {str(value)!r} (parametrised) does not exist at {path}"))
    return path.resolve()


@pytest.fixture(scope="session")
def ptq_session(pytestconfig):
    """The run's :class:`PTQSession`: ``ptq_session.analysis(model, data, float_model,
    data_num)`` returns the shared analysis of any model (one per worker under xdist)."""
    return ptq_session_mod.get(pytestconfig)


@pytest.fixture
def ptq_settings(request, ptq_session):
    """This test's :class:`Settings`: its ``ptq`` marker, then ``--ptq-*``, then ``ptq_*`` ini keys."""
    try:
        return ptq_session.settings_for(request.node)
    except PTQError as exc:
        _fail(exc)


_MISSING = {
    "model": "no model to test: pass --ptq-model PATH, set ptq_model in [tool.pytest.ini_options], "
             "or mark the test @pytest.mark.ptq(model=...)",
    "data": "no calibration data: pass --ptq-data PATH, set ptq_data in [tool.pytest.ini_options], "
            "or mark the test @pytest.mark.ptq(data=...)",
}


def _required_path(request, settings, key):
    """An indirect parameter, else the setting; a missing one fails the test in one sentence."""
    path = _param_path(request, key) or getattr(settings, key)
    if path is None:
        _fail(PTQError(_MISSING[key]))
    return path


@pytest.fixture
def ptq_model(request, ptq_settings):
    """Path of the calibrated QDQ model under test (indirect parametrisation overrides it)."""
    return _required_path(request, ptq_settings, "model")


@pytest.fixture
def ptq_data(request, ptq_settings):
    """Path of the calibration data (folder or .npz; indirect parametrisation overrides it)."""
    return _required_path(request, ptq_settings, "data")


@pytest.fixture
def ptq_analysis(request, ptq_session, ptq_settings, ptq_model, ptq_data):
    """The shared :class:`Analysis` of this test's model and data: compiled once per session,
    float reference and results cached for every test on the same model."""
    analysis = ptq_session.analysis(ptq_model, ptq_data, ptq_settings.float_model, ptq_settings.data_num,
                                    ptq_settings.custom_op_library)
    ptq_session.use(request.node, analysis)  # the report lists a model that fails to load too
    try:
        _ = analysis.engine  # compile in setup, so a bad model or data is one sentence, not a traceback
        error = None
    except (PTQError, Warning) as exc:  # a warning: raised where warnings are errors
        error = as_sentence(exc)
        if error is None:
            raise
    if error is not None:  # outside the except block: the sentence once, not twice with a chain
        _fail(error)
    return analysis


@pytest.fixture
def ptq(request, ptq_session, ptq_settings, ptq_analysis):
    """Assertion helpers on this test's model: ``ptq.assert_outputs()``, ``ptq.assert_nodes()``,
    ``ptq.assert_accuracy(evaluate)``, ``ptq.assert_baseline()`` (and ``check_*`` forms that
    return the result instead of raising)."""
    from .checks import PTQ

    node = request.node
    return PTQ(ptq_analysis, ptq_settings, lambda result: ptq_session.record(node, ptq_analysis, result),
               lambda: ptq_session.baseline_path(node, ptq_settings), commands=ptq_session.commands(node),
               base=Path(node.path).parent, written=ptq_session.baselines_written)

"""Spreading a suite over pytest-xdist workers one model at a time.

With ``-n N`` xdist's default scheduling hands out single tests, so the items of one model
land on several workers and each of them compiles that model's engine. Here the items of
one model form one unit that goes to one worker; every other test is still handed out
alone. xdist's own ``--dist loadgroup`` cannot carry this: it tags node ids on the workers
and pytest 9 no longer lets a plugin rename an item. So the workers, which collect, write
the model of each item to a small file the controller named, and the controller's
scheduler reads it when it splits the collection. All workers collect the same items
(xdist checks), so they write the same file; a worker that cannot write it only costs the
grouping, never a test.

Import this module only where xdist is installed.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from xdist.scheduler import LoadScopeScheduling

from . import guard

# the controller names the groups file and the cores folder in every worker's ``workerinput``
# under these keys: a worker whose temporary folder differs (TMPDIR) still uses the
# controller's, which the controller removes at its end
WORKERINPUT_KEY = "ptq_groups_file"
CORES_KEY = "ptq_cores_folder"


def groups_file(testrunuid):
    """The file one run's workers write their groups to, in the system's temporary folder."""
    return Path(tempfile.gettempdir()) / f"pytest-ptq-groups-{testrunuid}.json"


def cores_folder(testrunuid):
    """The folder where one run's workers each keep a file while they run (see
    :func:`~pytest_ptq.engine.runtime.share_cores`), in the system's temporary folder."""
    return Path(tempfile.gettempdir()) / f"pytest-ptq-cores-{testrunuid}"


# A run's files left longer than this ago: its controller was killed (kill -9, a CI limit),
# no other run reads them. A day, as a run may last hours.
STALE_AFTER_S = 86400.0


def sweep_stale(now=None):
    """Remove the groups files and core folders of runs whose controller was killed before it
    removed them (older than :data:`STALE_AFTER_S`): the next run, with a run id of its own,
    would never. Returns the paths removed; never raises."""
    import shutil
    import time

    now = time.time() if now is None else now
    removed = []
    for pattern in ("pytest-ptq-groups-*.json", "pytest-ptq-cores-*"):
        for path in Path(tempfile.gettempdir()).glob(pattern):
            try:
                if path.is_symlink() or now - path.stat().st_mtime <= STALE_AFTER_S:
                    continue
                shutil.rmtree(path) if path.is_dir() else path.unlink()
                removed.append(path)
            except OSError:
                continue
    return removed


def write_groups(path, models):
    """Worker: write ``{node id: model path}`` (``models``) to ``path``, atomically, so that
    the controller never reads half a file while another worker rewrites it."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(models), encoding="utf-8")
        guard.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)  # no grouping then; every test still runs


class ModelScheduling(LoadScopeScheduling):
    """xdist scheduling whose unit of work is a model's items (or a lone test)."""

    def __init__(self, config, log=None, path=None):
        super().__init__(config, log)
        self._path = path
        self._models = None

    def _split_scope(self, nodeid):
        if self._models is None:  # first asked once every worker has collected
            try:
                self._models = json.loads(Path(self._path).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                self._models = {}
            if not isinstance(self._models, dict):
                self._models = {}
        model = self._models.get(nodeid)
        # "::" cannot start a node id, so a model's unit never equals a test's
        return f"::ptq-model::{model}" if model else nodeid

"""Where `reslice ui` reads: the run records in the cluster (launcher/adapters/kube.Kube) and each
run's directory (launcher/adapters/rundir.RunDir), the report built by the accounting `status` uses
(launcher/core/accounting.build_report, as launcher/report/io.run_report calls it; here the metrics
are read once for both the report and the loss chart), and the sweeps' stored results
(launcher/sweep/files.load_sweep, as `sweep-report` reads them). Every failure becomes one line on the page, never an exception
out of a request: an unreachable cluster or an unreadable run directory is shown, and the server
stays up. Called by launcher/ui/server.py."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

from launcher.adapters.kube import Kube
from launcher.adapters.rundir import RunDir
from launcher.core.accounting import build_report
from launcher.core.errors import UserError, environment_error
from launcher.core.labels import LABEL_RUN
from launcher.sweep.files import SWEEP_JSON, load_sweep
from launcher.ui.model import pod_row, run_page, run_row, sweep_page

# A sweep's name as `reslice sweep --name` allows it: never a path out of the sweeps directory.
_SWEEP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class Unavailable(Exception):
    """What a page shows instead of its data: one line saying what could not be read."""


def one_line(e: BaseException) -> str:
    """The CLI's one line for a failure of the environment (launcher/core/errors.py), or the
    exception's own words: a page shows it rather than a traceback."""
    if isinstance(e, UserError):
        return str(e)
    known = environment_error(e)
    text = known[1] if known else f"{type(e).__name__}: {e}"
    return " ".join(text.split())[:300]


class Sources:
    """The cluster, connected on first use (and again after a failure: a cluster that comes back
    is picked up without restarting the server), and the run directories its records name."""

    def __init__(self, connect: Callable[[], Kube], sweeps: Path | None = None) -> None:
        self._connect = connect
        self.sweeps_dir = sweeps
        self._kube: Kube | None = None
        self._lock = threading.Lock()

    def kube(self) -> Kube:
        with self._lock:
            if self._kube is None:
                try:
                    self._kube = self._connect()
                except Exception as e:
                    raise Unavailable(one_line(e)) from e
            return self._kube

    def _call(self, what: Callable):
        kube = self.kube()
        try:
            return what(kube)
        except Exception as e:
            with self._lock:  # reconnect next time: the address or the credentials may have changed
                self._kube = None
            raise Unavailable(one_line(e)) from e

    def runs(self) -> dict:
        """The runs page: one row per record of the namespace, newest first."""
        records = self._call(lambda k: k.records())
        now = time.time()
        rows = []
        for rec in sorted(records, key=lambda r: r.created_at, reverse=True):
            try:
                rundir = RunDir(rec.spec.run_dir, rec.spec.trainer)
                rows.append(run_row(rec, build_report(rec, rundir.metrics(), rundir.ledger(), now), now))
            except Exception as e:  # this run's directory: the others are still listed
                rows.append(run_row(rec, None, now, f"run directory {rec.spec.run_dir}: {one_line(e)}"))
        return {"namespace": self.kube().namespace, "runs": rows, "sweeps": self.sweeps(), "now": now}

    def sweeps(self) -> list[str]:
        """The sweeps stored under the sweeps directory (local: `reslice sweep`'s default ./sweeps)."""
        root = self.sweeps_dir
        try:
            return sorted(p.parent.name for p in root.glob(f"*/{SWEEP_JSON}")) if root else []
        except OSError:
            return []

    def sweep(self, name: str) -> dict:
        """A sweep's page, from its sweep.json (what `reslice sweep-report` reads)."""
        if self.sweeps_dir is None or not _SWEEP_NAME.fullmatch(name):
            raise Unavailable(f"no sweep named {name!r}")
        try:
            return sweep_page(*load_sweep(str(self.sweeps_dir / name)))
        except Exception as e:
            raise Unavailable(one_line(e)) from e

    def run(self, name: str) -> dict:
        """One run's page, or Unavailable with the reason."""
        got = self._call(lambda k: k.get_record(name))
        if got is None:
            raise Unavailable(f"no run named {name!r} in namespace {self.kube().namespace}")
        rec = got[0]
        try:
            rundir = RunDir(rec.spec.run_dir, rec.spec.trainer)
            metrics, ledger = rundir.metrics(), rundir.ledger()
            committed = rundir.latest_committed_step()
        except Exception as e:
            raise Unavailable(f"run directory {rec.spec.run_dir}: {one_line(e)}") from e
        pods = self._call(lambda k: k.pods(f"{LABEL_RUN}={name}"))
        now = time.time()
        report = build_report(rec, metrics, ledger, now)
        return run_page(rec, report, metrics, ledger, committed, [pod_row(p) for p in pods], now)

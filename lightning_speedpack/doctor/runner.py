"""Run an unmodified training script with the pack's diagnostics attached to every Trainer.

The runner wraps ``Trainer.__init__`` of every installed Lightning namespace
(``pytorch_lightning`` and ``lightning.pytorch``, LightningCLI's Trainers included) for the
duration of the script so that each Trainer the script builds gets one instance of every
registered diagnostic (see :mod:`lightning_speedpack.core.registry`) plus a recorder of wall
time and samples. Nothing of this stays behind: the wrapper is removed when the script ends,
however it ends.

Ranks started by Lightning's ``ddp`` launcher re-run the script in new interpreters that import
nothing of ours; a ``sitecustomize`` on ``PYTHONPATH`` (see ``_bootstrap/``) installs the same
wrapper there, so every rank runs the same callbacks and their collectives match.
"""

from __future__ import annotations

import functools
import gc
import importlib
import os
import runpy
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_speedpack.core.hook_hub import HookHub, callbacks_of
from lightning_speedpack.core.lightning import Callback, classes
from lightning_speedpack.core.registry import (
    Diagnosable,
    Diagnostic,
    DoctorContext,
    registered_diagnostics,
)
from lightning_speedpack.core.tables import merge_findings
from lightning_speedpack.doctor.recorder import RunRecorder
from lightning_speedpack.doctor.report import Finding, Report, RunSummary, ordered
from lightning_speedpack.doctor.spawned import carry, nothing_to_undo

if TYPE_CHECKING:
    import pytorch_lightning as pl

__all__ = ["TOOLS", "DoctorSession", "ScriptResult", "import_tools", "run_script"]

#: Every tool module that registers a diagnostic (imported by the doctor, never the reverse).
TOOLS = (
    "lightning_speedpack.throughput.callback",
    "lightning_speedpack.sync_points.callback",
    "lightning_speedpack.retention.doctor",
    "lightning_speedpack.batch_size.callback",
    "lightning_speedpack.advisor.callback",
    "lightning_speedpack.timeline.doctor",
    "lightning_speedpack.data_xray.profiler",
    "lightning_speedpack.wall_time.callback",
    "lightning_speedpack.what_if.callback",
    "lightning_speedpack.comm.callback",
)


def import_tools() -> None:
    """Import every tool, so each registers its diagnostic (the package itself imports lazily)."""
    for module in TOOLS:
        importlib.import_module(module)


CHILD_ENV = "LIGHTNING_SPEEDPACK_DOCTOR_SCRIPT"
DEEP_ENV = "LIGHTNING_SPEEDPACK_DOCTOR_DEEP"  # "1": the session is --deep (for re-launched ranks)
ONLY_ENV = "LIGHTNING_SPEEDPACK_DOCTOR_ONLY"  # comma-separated --only names
FLAGS_ENV = "LIGHTNING_SPEEDPACK_DOCTOR_FLAGS"  # comma-separated opt-in flags ("--what-if")
_BOOTSTRAP_DIR = str(Path(__file__).with_name("_bootstrap"))


@dataclass
class _Attached:
    """The doctor's callbacks on one Trainer, and what they found.

    Picklable (names, not :class:`Diagnostic` objects): under ``ddp_spawn`` it travels to the
    spawned ranks, where rank 0 computes :meth:`parts` and sends them back (:mod:`.spawned`).
    """

    recorder: RunRecorder
    diagnostics: list[tuple[str, Callback]] = field(default_factory=list)  # (name, callback)
    carried: Any = None  # what spawned ranks sent back: parts, or a line saying why not

    def parts(self) -> tuple[list[Finding], list[RunSummary]]:
        """The findings (rank 0's, read with every rank in view) and runs with their figures."""
        if self.carried is not None:
            return _carried(self.carried)
        figures: dict[str, Any] = {}
        found: list[Finding] = []
        for name, callback in self.diagnostics:
            if isinstance(callback, Diagnosable):
                found.extend(_safe_findings(name, callback))
                figures.update(callback.doctor_figures())
        # Under DDP: rank 0's findings and figures read with every rank in view.
        found = self.recorder.revise_findings(found)
        self.recorder.revise_figures(figures)
        for run in self.recorder.runs:
            run.figures.update(figures)
        return ordered(merge_findings(found)), list(self.recorder.runs)

    def take(self, carried: Any) -> None:
        """Keep what the spawned ranks sent back (their fit is this Trainer's)."""
        self.carried = carried


class DoctorSession:
    """Attaches diagnostics to every Trainer built while installed, and collects the report.

    Args:
        deep: also attach the diagnostics registered as ``deep``, and let every factory turn on
            its costlier measurements (``DoctorContext.deep``: the data profiler's ceilings
            probe, the retention walk on every step).
        only: attach just these diagnostics (names as in ``registered_diagnostics()``; ``deep``
            ones named here are attached too). Checked by :meth:`install`.
        flags: the opt-in flags given (``{"--what-if"}``): a diagnostic registered with
            ``opt_in`` is attached only when its flag is here (or ``only`` names it).

    Example:
        >>> session = DoctorSession()
        >>> with session.installed():
        ...     pass  # build and fit Trainers here
        >>> session.report().runs
        []
    """

    def __init__(
        self,
        *,
        deep: bool = False,
        only: Iterable[str] | None = None,
        flags: Iterable[str] = (),
    ) -> None:
        names = None if only is None or isinstance(only, str) else list(only)  # read once
        if only is not None and (names is None or any(not isinstance(n, str) for n in names)):
            raise TypeError(f"`only` must be a collection of diagnostic names, got {only!r}")
        self.deep = bool(deep)
        self.only = None if names is None else frozenset(names)
        self.flags = frozenset(flags)
        self._attached: list[_Attached] = []
        self._originals: dict[type[Any], Any] = {}
        self._fit_originals: dict[type[Any], Any] = {}

    @classmethod
    def from_environment(cls) -> DoctorSession:
        """The session ``speedpack doctor`` asked for (how its re-launched DDP ranks get it)."""
        only = os.environ.get(ONLY_ENV, "")
        flags = os.environ.get(FLAGS_ENV, "")
        return cls(
            deep=os.environ.get(DEEP_ENV, "") == "1",
            only=[n for n in only.split(",") if n] if only else None,
            flags=[f for f in flags.split(",") if f],
        )

    def selected(self) -> list[Diagnostic]:
        """The registered diagnostics this session attaches, lowest ``order`` first."""
        return [
            d
            for d in registered_diagnostics()
            if (
                d.name in self.only
                if self.only is not None
                else (self.deep or not d.deep) and (not d.opt_in or d.opt_in in self.flags)
            )
        ]

    def skipped_deep(self) -> list[str]:
        """What this session leaves out that ``--deep`` would add (for the report's hint)."""
        if self.deep:
            return []
        # Without --only, the default set leaves out exactly the `deep` diagnostics.
        skipped = (
            [] if self.only is not None else [d.name for d in registered_diagnostics() if d.deep]
        )
        return skipped + [f"{d.name}: {d.deep_adds}" for d in self.selected() if d.deep_adds]

    def install(self) -> None:
        """Wrap ``Trainer.__init__`` of every installed Lightning namespace (idempotent).

        Raises:
            ValueError: ``only`` names a diagnostic nobody registered.
        """
        if self._originals:
            return
        import_tools()
        if self.only is not None:
            known = {d.name for d in registered_diagnostics()}
            unknown = sorted(self.only - known)
            if unknown:
                raise ValueError(
                    f"unknown diagnostic(s) {', '.join(unknown)}; choose from "
                    f"{', '.join(sorted(known))}"
                )
        for trainer_type in classes("Trainer"):
            self._originals[trainer_type] = self._wrap(trainer_type)
            self._fit_originals[trainer_type] = self._wrap_fit(trainer_type)

    def _wrap(self, trainer_type: type[Any]) -> Any:
        original = trainer_type.__init__
        session = self

        def __init__(trainer: pl.Trainer, *args: Any, **kwargs: Any) -> None:
            kwargs["callbacks"] = session._with_diagnostics(kwargs)
            original(trainer, *args, **kwargs)

        __init__.__wrapped__ = original  # type: ignore[attr-defined]
        trainer_type.__init__ = __init__
        return original

    def _wrap_fit(self, trainer_type: type[Any]) -> Any:
        # The wall-time ledger's first hook comes after Lightning has set up the strategy and
        # the process group, its last before the module's teardown and the profiler's summary:
        # tell it when `fit` was entered and returned, so that time is charged too.
        original = trainer_type.fit
        session = self

        @functools.wraps(original)
        def fit(trainer: pl.Trainer, *args: Any, **kwargs: Any) -> Any:
            _tell(trainer, "fit_entered")
            uncarry = session._carry(trainer)
            try:
                return original(trainer, *args, **kwargs)
            finally:
                uncarry()
                _tell(trainer, "fit_returned")

        trainer_type.fit = fit
        return original

    def _carry(self, trainer: Any) -> Callable[[], None]:
        """Under a launcher that spawns the ranks, have rank 0's report sent back here."""
        try:  # a strategy of the user's own may answer oddly: the fit goes on regardless
            running = callbacks_of(trainer)
            for attached in self._attached:
                if any(c is attached.recorder for c in running):
                    launcher = getattr(getattr(trainer, "strategy", None), "launcher", None)
                    return carry(launcher, attached.parts, attached.take)
        except Exception:
            pass
        return nothing_to_undo

    def uninstall(self) -> None:
        """Restore every wrapped ``Trainer.__init__`` and ``Trainer.fit`` (idempotent)."""
        for trainer_type, original in self._originals.items():
            trainer_type.__init__ = original
        for trainer_type, original in self._fit_originals.items():
            trainer_type.fit = original
        self._originals.clear()
        self._fit_originals.clear()

    @contextmanager
    def installed(self) -> Iterator[DoctorSession]:
        """Install for the duration of a ``with`` block, uninstalling however it exits."""
        self.install()
        try:
            yield self
        finally:
            self.uninstall()

    def _with_diagnostics(self, kwargs: dict[str, Any]) -> list[Callback]:
        given = kwargs.get("callbacks")
        callbacks: list[Callback] = (
            []
            if given is None
            else [given]
            if isinstance(given, classes("Callback"))
            else list(given)
        )
        ctx = DoctorContext(trainer_kwargs=dict(kwargs), deep=self.deep)
        attached = _Attached(recorder=RunRecorder())
        created: list[Callback] = []
        for diagnostic in self.selected():
            mine = next((c for c in callbacks if isinstance(c, diagnostic.callback_type)), None)
            if mine is None:  # the user's own instance is reused, never doubled
                mine = diagnostic.factory(ctx)
                created.append(mine)
            attached.diagnostics.append((diagnostic.name, mine))
        created.append(attached.recorder)
        # One callback for all the doctor's own, in the place and order they had: on a
        # millisecond step Lightning's loop over each callback for each hook was a large share
        # of the doctor's cost. The user's own instances stay where the user put them.
        callbacks.append(HookHub(created, owns=True))
        self._attached.append(attached)
        return callbacks

    def report(self) -> Report:
        """Collect runs and findings from every Trainer built so far."""
        report = Report(skipped=self.skipped_deep())
        for attached in self._attached:
            found, runs = attached.parts()
            report.findings.extend(found)
            report.runs.extend(runs)
        return report


def _tell(trainer: Any, method: str) -> None:
    """Call ``method(now)`` on the trainer's wall-time ledgers, and on nothing else.

    A user's callback of another class with a method of that name is never called: the doctor
    must not change what the job runs.
    """
    from lightning_speedpack.wall_time.callback import WallTimeLedger

    now = time.perf_counter()
    for callback in callbacks_of(trainer):
        if isinstance(callback, WallTimeLedger):
            getattr(callback, method)(now)


def _carried(carried: Any) -> tuple[list[Finding], list[RunSummary]]:
    if isinstance(carried, tuple):
        return carried
    # rank 0 could not send its report: say so rather than report an empty fit
    line = f"the spawned ranks' report could not come back to this process ({carried})"
    return [Finding("doctor", "spawned-report-lost", line, severity="info")], []


def _safe_findings(name: str, callback: Diagnosable) -> list[Finding]:
    # A diagnostic that fails must not hide the others' findings.
    try:
        return list(callback.doctor_findings())
    except Exception as err:  # pragma: no cover - defensive
        return [
            Finding(
                name,
                "diagnostic-failed",
                f"{type(err).__name__}: {err}",
                severity="info",
            )
        ]


@dataclass
class ScriptResult:
    """How the script ended and what the doctor saw.

    ``error`` is the exception the script raised (None when it returned or called ``sys.exit``);
    :meth:`print_traceback` prints it as Python would, starting at the script's own frames.
    """

    exit_code: int
    report: Report
    script: str = ""
    error: BaseException | None = None

    def print_traceback(self) -> None:
        """Print the script's traceback to stderr (nothing when it raised none)."""
        if self.error is None:
            return
        tb = self.error.__traceback__
        # Drop the runner's own frames so the traceback starts where the user's code does.
        while tb is not None and tb.tb_frame.f_code.co_filename != self.script:
            tb = tb.tb_next
        traceback.print_exception(
            type(self.error), self.error, tb or self.error.__traceback__, file=sys.stderr
        )


def run_script(
    script: str | os.PathLike[str],
    args: Sequence[str] = (),
    *,
    deep: bool = False,
    only: Iterable[str] | None = None,
    flags: Iterable[str] = (),
) -> ScriptResult:
    """Run ``script`` as ``__main__`` with ``args`` under a :class:`DoctorSession`.

    The script sees the ``sys.argv`` and ``sys.path[0]`` it would see if run directly. An
    exception it raises is kept in the result (see :meth:`ScriptResult.print_traceback`), and
    the exit code is what Python would have returned. ``deep`` and ``only`` choose the
    diagnostics as :class:`DoctorSession` does, on every DDP rank the script starts. The
    script's garbage is collected as soon as it ends, so its loaders' threads stop before the
    report is made.

    Raises:
        FileNotFoundError: ``script`` does not exist.
        ValueError: ``only`` names a diagnostic nobody registered.
    """
    path = Path(script).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"no training script at {str(script)!r}")
    session = DoctorSession(deep=deep, only=only, flags=flags)
    exit_code: int = 0
    error: BaseException | None = None
    with session.installed(), _script_environment(path, args, session):
        try:
            runpy.run_path(str(path), run_name="__main__")
        except SystemExit as exc:
            exit_code = _exit_code(exc.code)
        except KeyboardInterrupt as exc:
            exit_code, error = 130, exc
        except BaseException as exc:
            exit_code, error = 1, exc
    # The script's garbage (its Trainer, its loader) is collected now, on this thread, while
    # Python runs normally: a torchdata.nodes loader's `__del__` stops and joins its threads
    # at once. Left to a collection near exit, a thread told to stop there could still be
    # freeing its last tensor (the GIL released) as the interpreter finalized, and C++
    # aborted the process (`terminate called without an active exception`; 3 runs in 30 of
    # the invisibility grid's torchdata.nodes job). A plain job exits right after its script.
    gc.collect()
    report = session.report()
    report.command = [str(script), *args]
    report.created = datetime.now().astimezone().isoformat(timespec="seconds")
    return ScriptResult(exit_code, report, script=str(path), error=error)


@contextmanager
def _script_environment(path: Path, args: Sequence[str], session: DoctorSession) -> Iterator[None]:
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    saved_env = {
        k: os.environ.get(k) for k in (CHILD_ENV, DEEP_ENV, ONLY_ENV, FLAGS_ENV, "PYTHONPATH")
    }
    sys.argv = [str(path), *args]
    sys.path.insert(0, str(path.parent))
    os.environ[CHILD_ENV] = str(path)
    # Re-launched DDP ranks build their session from these (see _bootstrap/sitecustomize.py).
    os.environ[DEEP_ENV] = "1" if session.deep else "0"
    os.environ[ONLY_ENV] = ",".join(sorted(session.only)) if session.only is not None else ""
    os.environ[FLAGS_ENV] = ",".join(sorted(session.flags))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (_BOOTSTRAP_DIR, saved_env["PYTHONPATH"]) if p
    )
    try:
        yield
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # Python prints a non-int exit message and exits 1
    return 1

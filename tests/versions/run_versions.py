"""`make test-versions`: the pack's Lightning-facing tests on the oldest and newest stacks.

For each named environment this builds (or reuses) a venv under ``.venv-versions/<name>``,
installs the environment's torch first (a pinned release that pip takes from this machine's disk,
never a range that would pull a CUDA build from the registry), then its Lightning pins and
``pip install -e . pytest pytest-timeout``, and runs :data:`SUBSET`: the fast tests that exercise
the Lightning internals the pack leans on (the profiler's action names, the data fetcher, the fit
and epoch loops, the logger connector, the hooks' order). It prints one line per environment::

    PASS newest  py3.11.7 torch 2.15.0 pytorch-lightning 2.6.6  388 passed, 0 failed, 25 skipped  \
setup 2.1 s (reused), tests 128.0 s

and exits 1 if any environment failed (2 on bad arguments). A venv is reused while its stamp (the
Python, the pins, the package's ``pyproject.toml``) matches; ``--rebuild`` starts it afresh.

Usage::

    python tests/versions/run_versions.py                  # every environment in ENVIRONMENTS
    python tests/versions/run_versions.py oldest           # one of them
    python tests/versions/run_versions.py pl23=torch==2.13.0,pytorch-lightning==2.3.3  # ad hoc
    python tests/versions/run_versions.py newest -- tests/core -k profiler  # other tests

The venvs use the Python that runs this script (3.11 here: the torch wheels on this machine's disk
are for 3.11 only). The script needs nothing but the standard library.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "DESELECT",
    "ENVIRONMENTS",
    "MARKERS",
    "SUBSET",
    "Environment",
    "Outcome",
    "Tally",
    "failure_lines",
    "main",
    "parse_args",
    "parse_environment",
    "read_junit",
    "stamp_for",
    "stamp_matches",
    "summary_line",
]

ROOT = Path(__file__).resolve().parents[2]

#: Where the venvs live (ignored by git through a ``.gitignore`` the script writes there).
VENVS = ROOT / ".venv-versions"


@dataclass(frozen=True)
class Environment:
    """One torch + Lightning pair: the venv's name and the pins installed into it.

    ``torch`` is installed alone, first, so that pip takes that exact release from this machine's
    disk; ``packages`` (the Lightning pins) come with the package itself.
    """

    name: str
    torch: str
    packages: tuple[str, ...]
    #: Install from the package registry alone, past this machine's pip config (which caps torch
    #: at the releases on its disk, 2.14.1): torch 2.15 comes from the registry, a CUDA build of
    #: about 3 GB that runs on the CPU.
    registry_only: bool = False

    def requirements(self) -> list[str]:
        """Every pin, torch first, as pip is given them."""
        return [f"torch=={self.torch}", *self.packages]

    def pins(self) -> dict[str, str]:
        """Distribution name -> the exact version the venv must end up with."""
        pins = {"torch": self.torch}
        for requirement in self.packages:
            name, sep, version = requirement.partition("==")
            if sep:
                pins[name.strip().lower()] = version.strip()
        return pins

    def describe(self) -> str:
        """``torch 2.13.0 pytorch-lightning 2.1.4``: the pins, for the summary line."""
        return " ".join(f"{name} {version}" for name, version in self.pins().items())


#: The environments `make test-versions` runs, in order. `oldest` is the floor the pack claims:
#: the oldest pytorch-lightning whose subset passes on the oldest torch on this disk. Tried on
#: torch 2.13.0: 2.1.4, 2.2.x and 2.3.3 do not import beside setuptools >= 81, which torch
#: pulls in (they import `pkg_resources`); 2.4.0, and 2.1.4 given setuptools<81, count no
#: checkpoint saves (Lightning times `save_checkpoint` from 2.5.0 on; see
#: `core.lightning.INTERNALS`); 2.5.0 passes.
ENVIRONMENTS: dict[str, Environment] = {
    env.name: env
    for env in (
        Environment("oldest", torch="2.13.0", packages=("pytorch-lightning==2.5.0",)),
        Environment(
            "newest", torch="2.15.0", packages=("pytorch-lightning==2.6.6",), registry_only=True
        ),
    )
}

#: The tests run in each environment: the ones that drive real Trainers through the Lightning
#: internals the pack reads. Each file is parametrised over the installed namespaces, so with
#: pytorch-lightning alone every case runs once.
SUBSET: tuple[str, ...] = (
    "tests/test_contract.py",
    "tests/core",
    "tests/throughput",
    "tests/wall_time",
    "tests/data_xray",
    "tests/timeline",
    "tests/versions/test_internals.py",
)

#: Tests of the subset left out: slow ones that exercise torch's DataLoader or process start
#: rather than Lightning, a timing race, and one that needs both namespaces installed.
DESELECT: tuple[str, ...] = (
    # 60 s of spawned DataLoader workers; the fork and in-process cases stay.
    "tests/data_xray/test_profiler.py::test_stages_are_reported_as_measured_inside_the_workers[spawn]",
    # 25 s: two processes, each a fit; the single-process run checks stay.
    "tests/data_xray/test_run_check.py::test_under_ddp_each_ranks_ceilings_agree_with_its_own_rate",
    # Two timings within 15% of each other: fails on a loaded machine whatever the versions.
    "tests/data_xray/test_ceilings.py::test_model_ceiling_matches_timing_steps_on_an_in_memory_batch",
    # Asserts that `lightning` is installed; these venvs have pytorch-lightning only.
    "tests/core/test_lightning.py::test_installed_does_not_import_the_lightning_package",
)

#: The fast tests only (what `make test` runs), and none that needs a GPU.
MARKERS = "not slow and not ddp and not browser and not grid and not cuda"

#: What the subset needs besides the package and its dependencies.
TEST_DEPS: tuple[str, ...] = ("pytest>=8", "pytest-timeout>=2.2")

STAMP_NAME = ".speedpack-versions-stamp"


# ---- arguments ---------------------------------------------------------------------------------


def parse_environment(spec: str) -> Environment:
    """``name`` of :data:`ENVIRONMENTS`, or an ad-hoc ``name=torch==X,pkg==Y,...``.

    Raises:
        ValueError: an unknown name, or an ad-hoc spec without an exact torch pin.

    Example:
        >>> parse_environment("pl23=torch==2.13.0,pytorch-lightning==2.3.3")
        Environment(name='pl23', torch='2.13.0', packages=('pytorch-lightning==2.3.3',),
                    registry_only=False)
    """
    name, sep, pins = spec.partition("=")
    name = name.strip()
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
        raise ValueError(
            f"an environment's name is letters, digits, '.', '_' and '-', got {name!r}"
        )
    if not sep:
        if name not in ENVIRONMENTS:
            known = ", ".join(ENVIRONMENTS)
            raise ValueError(f"unknown environment {name!r}: known are {known}, or name=pins")
        return ENVIRONMENTS[name]
    requirements = [part.strip() for part in pins.split(",") if part.strip()]
    torch = [r for r in requirements if re.fullmatch(r"torch\s*==\s*\S+", r)]
    if len(torch) != 1:
        raise ValueError(
            f"{spec!r}: an ad-hoc environment pins torch exactly once (torch==X: pip takes it "
            "from this disk; a range would pull a CUDA build from the registry)"
        )
    others = tuple(r for r in requirements if r not in torch)
    if any(re.match(r"torch\b(?!-)", r) for r in others):
        raise ValueError(f"{spec!r}: torch is given as torch==X only")
    return Environment(name, torch=torch[0].split("==", 1)[1].strip(), packages=others)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The command line: environments, then optionally ``--`` and the tests to run instead."""
    argv = list(argv)
    tests: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, tests = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(
        prog="run_versions.py",
        description="Run the pack's Lightning-facing tests on each torch/Lightning environment.",
    )
    parser.add_argument(
        "environments",
        nargs="*",
        metavar="ENV",
        help=f"a name ({', '.join(ENVIRONMENTS)}; default: all) or name=torch==X,pkg==Y,...",
    )
    parser.add_argument("--rebuild", action="store_true", help="rebuild the venvs from scratch")
    parser.add_argument("--list", action="store_true", help="print the environments and exit")
    parser.add_argument(
        "--timeout",
        type=float,
        default=420.0,
        help="seconds the tests of one environment may take (default: 420)",
    )
    parser.add_argument(
        "--venvs", type=Path, default=VENVS, help=f"where the venvs live (default: {VENVS})"
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="stream pip's and pytest's output"
    )
    args = parser.parse_args(argv)
    try:
        args.environments = [parse_environment(s) for s in args.environments] or list(
            ENVIRONMENTS.values()
        )
    except ValueError as error:
        parser.error(str(error))
    names = [env.name for env in args.environments]
    if len(set(names)) != len(names):
        parser.error(f"an environment is named twice: {names}")
    if args.timeout <= 0:
        parser.error(f"--timeout must be positive, got {args.timeout}")
    args.tests = tests or list(SUBSET)
    return args


# ---- the stamp ---------------------------------------------------------------------------------


def stamp_for(env: Environment, python: str, pyproject: bytes) -> dict[str, object]:
    """What a venv was built from: the Python, the pins and test deps, the package's pyproject.

    Example:
        >>> stamp = stamp_for(ENVIRONMENTS["newest"], "3.11.7", b"[project]")
        >>> stamp["python"], stamp["requirements"][0]
        ('3.11.7', 'torch==2.15.0')
    """
    return {
        "python": python,
        "requirements": [*env.requirements(), *TEST_DEPS],
        "registry_only": env.registry_only,
        "pyproject": hashlib.sha256(pyproject).hexdigest(),
    }


def stamp_matches(venv: Path, stamp: dict[str, object]) -> bool:
    """Whether ``venv`` was built from ``stamp`` and still has its interpreter."""
    try:
        found = json.loads((venv / STAMP_NAME).read_text())
    except (OSError, ValueError):
        return False
    return found == stamp and (venv / "bin" / "python").exists()


# ---- results -----------------------------------------------------------------------------------


@dataclass
class Tally:
    """How many tests passed, failed (failures and errors) and were skipped."""

    passed: int = 0
    failed: int = 0
    skipped: int = 0


def read_junit(path: Path) -> Tally | None:
    """The counts of a pytest ``--junitxml`` report, or None when there is none to read."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    counts = Tally()
    for suite in suites:
        total = int(suite.get("tests", 0))
        failed = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        skipped = int(suite.get("skipped", 0))
        counts.passed += total - failed - skipped
        counts.failed += failed
        counts.skipped += skipped
    return counts


@dataclass
class Outcome:
    """One environment's result: what was installed, the counts, the seconds, what went wrong."""

    env: Environment
    python: str
    installed: dict[str, str] = field(default_factory=dict)
    counts: Tally | None = None
    setup_s: float = 0.0
    tests_s: float = 0.0
    reused: bool = False
    error: str | None = None

    @property
    def passed(self) -> bool:
        """No error, and tests ran with none failed."""
        return (
            self.error is None
            and self.counts is not None
            and self.counts.failed == 0
            and self.counts.passed > 0
        )


def summary_line(outcome: Outcome) -> str:
    """One line: PASS/FAIL, the name, the versions, the counts, the seconds, and why it failed.

    Example:
        >>> env = Environment("oldest", torch="2.13.0", packages=("pytorch-lightning==2.5.0",))
        >>> outcome = Outcome(env, "3.11.7", installed={"torch": "2.13.0+cpu",
        ...     "pytorch-lightning": "2.5.0"}, counts=Tally(300, 0, 2), setup_s=61.23,
        ...     tests_s=140.0)
        >>> summary_line(outcome)  # doctest: +NORMALIZE_WHITESPACE
        'PASS oldest py3.11.7 torch 2.13.0+cpu pytorch-lightning 2.5.0  300 passed, 0 failed,
        2 skipped  setup 61.2 s, tests 140.0 s'
    """
    versions = " ".join(
        f"{name} {outcome.installed.get(name, pin)}" for name, pin in outcome.env.pins().items()
    )
    counts = outcome.counts
    tally = (
        f"{counts.passed} passed, {counts.failed} failed, {counts.skipped} skipped"
        if counts is not None
        else "no tests ran"
    )
    setup = f"setup {outcome.setup_s:.1f} s" + (" (reused)" if outcome.reused else "")
    line = (
        f"{'PASS' if outcome.passed else 'FAIL'} {outcome.env.name} py{outcome.python} "
        f"{versions}  {tally}  {setup}, tests {outcome.tests_s:.1f} s"
    )
    if outcome.error:
        line += f"  ({outcome.error})"
    return line


# ---- building and running ----------------------------------------------------------------------


class _StepFailed(Exception):
    """A step of building a venv failed; the message says which and where its log is."""


def _run(
    cmd: Sequence[str],
    log: Path,
    verbose: bool,
    timeout: float | None = None,
    extra_env: dict[str, str] | None = None,
) -> int:
    """Run ``cmd`` in its own process group, appending its output to ``log``; its exit code.

    On timeout the whole group is killed and 124 returned.
    """
    with log.open("a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        proc = subprocess.Popen(
            list(cmd),
            cwd=ROOT,
            env={**os.environ, **(extra_env or {})},
            stdout=None if verbose else out,
            stderr=subprocess.STDOUT if not verbose else None,
            start_new_session=True,
        )
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            out.write(f"\n[run_versions] killed after {timeout:.0f} s\n")
            return 124
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise


_VERSIONS = """\
import importlib.metadata as m, json, sys
names = sys.argv[1:]
found = {}
for name in names:
    try:
        found[name] = m.version(name)
    except m.PackageNotFoundError:
        pass
print(json.dumps(found))
"""


def _installed(python: Path, names: Sequence[str]) -> dict[str, str]:
    out = subprocess.run(
        [str(python), "-c", _VERSIONS, *names], capture_output=True, text=True, check=True
    )
    return dict(json.loads(out.stdout))


def _same_release(installed: str, pin: str) -> bool:
    """``2.13.0+cpu`` is the release ``2.13.0``."""
    return installed.split("+", 1)[0] == pin


def build(env: Environment, venv: Path, rebuild: bool, verbose: bool) -> tuple[bool, Path]:
    """Make ``venv`` hold ``env``'s pins; (whether it was reused, the install log).

    Raises:
        _StepFailed: a pip step failed or left another version than the pin.
    """
    python = venv / "bin" / "python"
    log = venv.parent / f"{env.name}.install.log"
    stamp = stamp_for(env, _python_version(), (ROOT / "pyproject.toml").read_bytes())
    if not rebuild and stamp_matches(venv, stamp):
        return True, log
    venv.parent.mkdir(parents=True, exist_ok=True)
    (venv.parent / ".gitignore").write_text("*\n")
    log.write_text("")
    if rebuild and venv.exists():
        shutil.rmtree(venv)
    (venv / STAMP_NAME).unlink(missing_ok=True)
    if not python.exists() and _run([sys.executable, "-m", "venv", str(venv)], log, verbose):
        raise _StepFailed(f"python -m venv failed: see {_rel(log)}")
    pip = [str(python), "-m", "pip", "install", "--quiet"]
    # No pip config file: its cap and this disk's indexes out of the way (the registry alone).
    pip_env = {"PIP_CONFIG_FILE": os.devnull} if env.registry_only else None
    # Torch alone first: the exact release lies on this machine's disk (or, registry-only, comes
    # from the registry), and with it installed nothing later asks pip for another one.
    if _run([*pip, f"torch=={env.torch}"], log, verbose, extra_env=pip_env) != 0:
        raise _StepFailed(f"installing torch=={env.torch} failed: see {_rel(log)}")
    steps = [*pip, "-e", ".", *env.requirements(), *TEST_DEPS]
    if _run(steps, log, verbose, extra_env=pip_env) != 0:
        raise _StepFailed(f"installing the package and its pins failed: see {_rel(log)}")
    pins = env.pins()
    # A venv reused across different pins may hold `lightning` from an earlier spec.
    unwanted = [n for n in ("lightning",) if n not in pins]
    if _installed(python, unwanted):
        _run([str(python), "-m", "pip", "uninstall", "--yes", "--quiet", *unwanted], log, verbose)
    installed = _installed(python, list(pins))
    wrong = {
        n: installed.get(n) for n, v in pins.items() if not _same_release(installed.get(n, ""), v)
    }
    if wrong:
        raise _StepFailed(f"pip left other versions than the pins: {wrong}; see {_rel(log)}")
    (venv / STAMP_NAME).write_text(json.dumps(stamp, indent=1))
    return False, log


def run_tests(
    env: Environment, venv: Path, tests: Sequence[str], timeout: float, verbose: bool
) -> tuple[Tally | None, int, Path]:
    """Run ``tests`` in ``venv``: their counts (None if no report), pytest's exit code, its log."""
    log = venv.parent / f"{env.name}.pytest.log"
    junit = venv.parent / f"{env.name}.junit.xml"
    log.write_text("")
    junit.unlink(missing_ok=True)
    cmd = [
        str(venv / "bin" / "python"),
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-q",
        "-m",
        MARKERS,
        f"--junitxml={junit}",
        *(f"--deselect={test}" for test in DESELECT),
        *tests,
    ]
    code = _run(cmd, log, verbose, timeout=timeout)
    return read_junit(junit), code, log


def run_environment(env: Environment, args: argparse.Namespace) -> Outcome:
    """Build ``env``'s venv and run the tests there; never raises for a failed step."""
    venv = args.venvs / env.name
    outcome = Outcome(env, _python_version())
    began = time.perf_counter()
    try:
        outcome.reused, _ = build(env, venv, args.rebuild, args.verbose)
    except _StepFailed as error:
        outcome.error = str(error)
        outcome.setup_s = time.perf_counter() - began
        return outcome
    outcome.setup_s = time.perf_counter() - began
    outcome.installed = _installed(venv / "bin" / "python", list(env.pins()))
    began = time.perf_counter()
    counts, code, log = run_tests(env, venv, args.tests, args.timeout, args.verbose)
    outcome.tests_s = time.perf_counter() - began
    outcome.counts = counts
    if code == 124:
        outcome.error = f"tests killed after {args.timeout:.0f} s: see {_rel(log)}"
    elif code != 0 and (counts is None or counts.failed == 0):
        outcome.error = f"pytest exited {code}: see {_rel(log)}"
    elif code != 0:
        outcome.error = f"see {_rel(log)}"
    return outcome


def _python_version() -> str:
    return ".".join(str(part) for part in sys.version_info[:3])


def _rel(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def failure_lines(text: str, most: int = 20) -> list[str]:
    """What to print of a failed step's log: pytest's FAILED/ERROR lines and its last line, or
    else the log's last lines (pip's notes about absent local indexes left out).

    Example:
        >>> failure_lines("x\\nFAILED t.py::a - boom\\nERROR t.py\\nERROR t.py\\n1 failed in 2s\\n")
        ['FAILED t.py::a - boom', 'ERROR t.py', '1 failed in 2s']
    """
    lines = [line for line in text.splitlines() if line.strip()]
    picked = list(dict.fromkeys(line for line in lines if line.startswith(("FAILED ", "ERROR "))))
    if picked:
        return [*picked[:most], lines[-1]]
    return [line for line in lines if "is ignored: it is neither" not in line][-most:]


def main(argv: Sequence[str] | None = None) -> int:
    """Run every environment asked for; 0 if all passed, 1 if any failed."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.list:
        for env in args.environments:
            print(f"{env.name}: {' '.join(env.requirements())}")
        return 0
    outcomes = []
    for env in args.environments:
        print(f"[{env.name}] {' '.join(env.requirements())} ...", flush=True)
        outcome = run_environment(env, args)
        outcomes.append(outcome)
        if not outcome.passed and not args.verbose:
            log = args.venvs / f"{env.name}.pytest.log"
            if outcome.counts is None or not log.exists():
                log = args.venvs / f"{env.name}.install.log"
            try:
                text = log.read_text(errors="replace")
            except OSError:
                text = ""
            print("\n".join(failure_lines(text)), flush=True)
        print(summary_line(outcome), flush=True)
    if len(outcomes) > 1:
        print("\n".join(summary_line(o) for o in outcomes))
    return 0 if all(o.passed for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())

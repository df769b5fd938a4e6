"""`make test-versions`' own logic: arguments, the stamp that lets a venv be reused, the summary.

Nothing here builds a venv or runs pip: the steps are recorded instead of run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.versions import run_versions as rv

OLDEST = rv.ENVIRONMENTS["oldest"]
NEWEST = rv.ENVIRONMENTS["newest"]


# ---- arguments -------------------------------------------------------------------------------


def test_no_environment_named_runs_all_of_them_on_the_subset() -> None:
    args = rv.parse_args([])
    assert args.environments == list(rv.ENVIRONMENTS.values())
    assert args.tests == list(rv.SUBSET)
    assert not args.rebuild
    assert args.timeout == 420.0


def test_named_and_ad_hoc_environments_in_the_order_given() -> None:
    args = rv.parse_args(["newest", "pl23=torch==2.13.0, pytorch-lightning==2.3.3,setuptools<81"])
    assert [env.name for env in args.environments] == ["newest", "pl23"]
    ad_hoc = args.environments[1]
    assert ad_hoc.torch == "2.13.0"
    assert ad_hoc.packages == ("pytorch-lightning==2.3.3", "setuptools<81")
    assert ad_hoc.requirements() == ["torch==2.13.0", "pytorch-lightning==2.3.3", "setuptools<81"]
    # only exact pins are checked after the install; a range is pip's to resolve
    assert ad_hoc.pins() == {"torch": "2.13.0", "pytorch-lightning": "2.3.3"}


def test_tests_after_a_double_dash_replace_the_subset() -> None:
    args = rv.parse_args(["oldest", "--rebuild", "--", "tests/core", "-k", "tap"])
    assert args.environments == [OLDEST]
    assert args.rebuild
    assert args.tests == ["tests/core", "-k", "tap"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["middle"], "unknown environment 'middle'"),
        (["x=pytorch-lightning==2.4.0"], "pins torch exactly once"),
        (["x=torch>=2.2,pytorch-lightning==2.4.0"], "pins torch exactly once"),
        (["x=torch==2.13.0,torch==2.14.1"], "pins torch exactly once"),
        (["x=torch==2.13.0,torch<3"], "torch is given as torch==X only"),
        (["../x=torch==2.13.0"], "letters, digits"),
        (["newest", "newest"], "named twice"),
        (["--timeout", "0"], "--timeout must be positive, got 0.0"),
    ],
)
def test_bad_arguments_say_what_is_allowed(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        rv.parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_package_named_like_torch_is_not_torch() -> None:
    env = rv.parse_environment("x=torch==2.13.0,torchmetrics==1.4.0")
    assert env.packages == ("torchmetrics==1.4.0",)


def test_list_prints_each_environment_and_builds_nothing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rv, "run_environment", _must_not_run)
    assert rv.main(["--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f"{env.name}: {' '.join(env.requirements())}" for env in rv.ENVIRONMENTS.values()
    ]


# ---- the stamp -------------------------------------------------------------------------------


def test_the_stamp_changes_with_the_python_the_pins_and_the_pyproject() -> None:
    base = rv.stamp_for(OLDEST, "3.11.7", b"a")
    assert base == rv.stamp_for(OLDEST, "3.11.7", b"a")
    assert base != rv.stamp_for(OLDEST, "3.11.8", b"a")
    assert base != rv.stamp_for(OLDEST, "3.11.7", b"b")
    assert base != rv.stamp_for(NEWEST, "3.11.7", b"a")
    assert base["requirements"] == [*OLDEST.requirements(), *rv.TEST_DEPS]


def test_a_venv_is_reused_only_while_its_stamp_matches_and_its_python_is_there(
    tmp_path: Path,
) -> None:
    venv = tmp_path / "oldest"
    stamp = rv.stamp_for(OLDEST, "3.11.7", b"a")
    assert not rv.stamp_matches(venv, stamp)  # nothing there
    (venv / "bin").mkdir(parents=True)
    (venv / rv.STAMP_NAME).write_text(json.dumps(stamp))
    assert not rv.stamp_matches(venv, stamp)  # no interpreter
    (venv / "bin" / "python").write_text("")
    assert rv.stamp_matches(venv, stamp)
    assert not rv.stamp_matches(venv, rv.stamp_for(OLDEST, "3.11.7", b"b"))
    (venv / rv.STAMP_NAME).write_text("{not json")
    assert not rv.stamp_matches(venv, stamp)


class _FakePip:
    """Stands in for the subprocesses: records each command, 'creates' the venv's python."""

    def __init__(self, installed: dict[str, str], venv: Path) -> None:
        self.commands: list[list[str]] = []
        self.envs: list[dict[str, str] | None] = []
        self.installed = installed
        self.venv = venv

    def run(
        self,
        cmd: list[str],
        log: Path,
        verbose: bool,
        timeout: float | None = None,
        extra_env: dict[str, str] | None = None,
    ) -> int:
        self.commands.append(list(cmd))
        self.envs.append(extra_env)
        if cmd[1:3] == ["-m", "venv"]:
            (self.venv / "bin").mkdir(parents=True)
            (self.venv / "bin" / "python").write_text("")
        return 0

    def versions(self, python: Path, names: list[str]) -> dict[str, str]:
        return {name: self.installed[name] for name in names if name in self.installed}


def _fake(monkeypatch: pytest.MonkeyPatch, venv: Path, installed: dict[str, str]) -> _FakePip:
    fake = _FakePip(installed, venv)
    monkeypatch.setattr(rv, "_run", fake.run)
    monkeypatch.setattr(rv, "_installed", fake.versions)
    return fake


def test_build_installs_torch_alone_first_then_reuses_the_venv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv = tmp_path / "venvs" / "oldest"
    fake = _fake(monkeypatch, venv, {"torch": "2.13.0+cpu", "pytorch-lightning": "2.4.0"})
    env = rv.Environment("oldest", torch="2.13.0", packages=("pytorch-lightning==2.4.0",))
    reused, _ = rv.build(env, venv, rebuild=False, verbose=False)
    assert not reused
    venv_step, torch_step, package_step = fake.commands
    assert venv_step[1:] == ["-m", "venv", str(venv)]
    assert torch_step[-1] == "torch==2.13.0"  # alone: pip takes it from this disk
    assert (
        package_step[-5:]
        == ["-e", ".", "torch==2.13.0", "pytorch-lightning==2.4.0", *rv.TEST_DEPS][-5:]
    )
    assert (tmp_path / "venvs" / ".gitignore").read_text() == "*\n"
    assert (venv / rv.STAMP_NAME).is_file()

    fake.commands.clear()
    reused, _ = rv.build(env, venv, rebuild=False, verbose=False)
    assert reused
    assert fake.commands == []

    # Other pins: the venv is installed over, not reused.
    other = rv.Environment("oldest", torch="2.13.0", packages=("pytorch-lightning==2.5.6",))
    fake.installed["pytorch-lightning"] = "2.5.6"
    reused, _ = rv.build(other, venv, rebuild=False, verbose=False)
    assert not reused
    assert [cmd[-1] for cmd in fake.commands][:1] == ["torch==2.13.0"]  # no new venv


def test_build_fails_when_pip_leaves_another_version_than_the_pin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv = tmp_path / "oldest"
    _fake(monkeypatch, venv, {**OLDEST.pins(), "torch": "2.14.1"})
    with pytest.raises(
        rv._StepFailed, match=r"other versions than the pins: \{'torch': '2.14.1'\}"
    ):
        rv.build(OLDEST, venv, rebuild=False, verbose=False)
    assert not (venv / rv.STAMP_NAME).exists()


def test_build_removes_a_lightning_left_by_earlier_pins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv = tmp_path / "newest"
    fake = _fake(
        monkeypatch, venv, {"torch": "2.15.0", "pytorch-lightning": "2.6.6", "lightning": "2.6.6"}
    )
    rv.build(NEWEST, venv, rebuild=False, verbose=False)
    assert fake.commands[-1][-4:] == ["uninstall", "--yes", "--quiet", "lightning"]


# ---- results and the summary line ------------------------------------------------------------


def test_junit_counts_failures_and_errors_as_failed(tmp_path: Path) -> None:
    report = tmp_path / "junit.xml"
    report.write_text(
        '<?xml version="1.0"?><testsuites><testsuite name="pytest" errors="1" failures="2" '
        'skipped="3" tests="20" time="1.0"></testsuite></testsuites>'
    )
    counts = rv.read_junit(report)
    assert counts == rv.Tally(passed=14, failed=3, skipped=3)
    assert rv.read_junit(tmp_path / "missing.xml") is None
    (tmp_path / "broken.xml").write_text("<testsuites")
    assert rv.read_junit(tmp_path / "broken.xml") is None


def test_summary_line_pass_and_reused() -> None:
    outcome = rv.Outcome(
        NEWEST,
        "3.11.7",
        installed={"torch": "2.14.1", "pytorch-lightning": "2.6.6"},
        counts=rv.Tally(371, 0, 3),
        setup_s=2.04,
        tests_s=128.0,
        reused=True,
    )
    assert outcome.passed
    assert rv.summary_line(outcome) == (
        "PASS newest py3.11.7 torch 2.14.1 pytorch-lightning 2.6.6  "
        "371 passed, 0 failed, 3 skipped  setup 2.0 s (reused), tests 128.0 s"
    )


@pytest.mark.parametrize(
    ("counts", "error", "tail"),
    [
        (
            rv.Tally(10, 1, 0),
            "see x.log",
            "10 passed, 1 failed, 0 skipped  setup 1.0 s, tests 0.0 s  (see x.log)",
        ),
        (
            None,
            "installing torch==2.13.0 failed",
            "no tests ran  setup 1.0 s, tests 0.0 s  (installing torch==2.13.0 failed)",
        ),
        (rv.Tally(0, 0, 0), None, "0 passed, 0 failed, 0 skipped  setup 1.0 s, tests 0.0 s"),
    ],
)
def test_summary_line_fail(counts: rv.Tally | None, error: str | None, tail: str) -> None:
    outcome = rv.Outcome(OLDEST, "3.11.7", counts=counts, setup_s=1.0, error=error)
    assert not outcome.passed
    line = rv.summary_line(outcome)
    # versions not installed (a failed install) show the pins
    assert line == f"FAIL oldest py3.11.7 {OLDEST.describe()}  {tail}"


def test_main_exits_one_when_any_environment_fails(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def fake_run(env: rv.Environment, args: Any) -> rv.Outcome:
        ok = env.name == "newest"
        return rv.Outcome(env, "3.11.7", counts=rv.Tally(5, 0 if ok else 1, 0))

    monkeypatch.setattr(rv, "run_environment", fake_run)
    assert rv.main(["--venvs", str(tmp_path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in out if line.startswith(("PASS", "FAIL"))][-2:] == [
        ["FAIL", "oldest"],
        ["PASS", "newest"],
    ]
    assert rv.main(["newest", "--venvs", str(tmp_path)]) == 0


def test_tests_killed_at_the_timeout_fail_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(rv, "build", lambda *a, **k: (True, tmp_path / "install.log"))
    monkeypatch.setattr(rv, "_installed", lambda python, names: {})
    monkeypatch.setattr(
        rv, "run_tests", lambda *a, **k: (rv.Tally(3, 0, 0), 124, tmp_path / "p.log")
    )
    args = rv.parse_args(["oldest", "--venvs", str(tmp_path), "--timeout", "9"])
    outcome = rv.run_environment(OLDEST, args)
    assert not outcome.passed
    assert outcome.error is not None
    assert outcome.error.startswith("tests killed after 9 s")


def _must_not_run(*args: object, **kwargs: object) -> rv.Outcome:
    raise AssertionError("--list built an environment")


def test_a_failed_install_shows_pips_last_lines_without_its_notes_on_absent_indexes() -> None:
    log = (
        "$ python -m pip install --quiet torch==9.9.9\n"
        "WARNING: Location 'file:///opt/pypi/simple/torch/' is ignored: it is neither a file "
        "nor a directory.\n"
        "ERROR: Could not find a version that satisfies the requirement torch==9.9.9\n"
    )
    assert rv.failure_lines(log) == [
        "$ python -m pip install --quiet torch==9.9.9",
        "ERROR: Could not find a version that satisfies the requirement torch==9.9.9",
    ]


def test_a_registry_only_environment_installs_past_the_machines_pip_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv = tmp_path / "venvs" / "newest"
    fake = _fake(monkeypatch, venv, {"torch": "2.15.0", "pytorch-lightning": "2.6.6"})
    rv.build(rv.ENVIRONMENTS["newest"], venv, rebuild=False, verbose=False)
    assert fake.commands[1][-1] == "torch==2.15.0"
    assert fake.envs[1:] == [{"PIP_CONFIG_FILE": os.devnull}] * 2  # both pip steps
    oldest = tmp_path / "venvs" / "oldest"
    fake = _fake(monkeypatch, oldest, {"torch": "2.13.0+cpu", "pytorch-lightning": "2.5.0"})
    rv.build(rv.ENVIRONMENTS["oldest"], oldest, rebuild=False, verbose=False)
    assert fake.envs == [None, None, None]  # this disk's torch, through the machine's config

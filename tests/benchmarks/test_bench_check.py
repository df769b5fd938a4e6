"""``benchmarks/bench_check.py`` (``make bench-check``): the bounds file, and the checker's logic.

No benchmark runs here: the checker is fed planted figures (a regressed one of each kind, and
passing ones) through its ``measure`` seam, and must FAIL the regressed ones with a line naming
the figure, its bound and the command that measures it.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from benchmarks import bench_check
from benchmarks.bench_check import Bound, check, format_line, judge, load_bounds

ROOT = Path(__file__).resolve().parents[2]

PLANTED = """
[[figure]]
name = "cache-small-pss-4w"
kind = "memory"
direction = "max"
bound = 1.05
tolerance = 0.03
command = ".venv/bin/python benchmarks/cache.py --only small"
measured = "planted"

[[figure]]
name = "wall-zoo-recall"
kind = "count"
direction = "min"
bound = 5
tolerance = 0
command = ".venv/bin/python benchmarks/wall_zoo.py --quick"
measured = "planted"

[[figure]]
name = "doctor-cost"
kind = "timing"
direction = "max"
bound = 1.03
tolerance = 0.07
command = ".venv/bin/python benchmarks/doctor_overhead.py --quick"
measured = "planted"
"""


def planted(tmp_path: Path, text: str = PLANTED) -> Path:
    path = tmp_path / "bounds.toml"
    path.write_text(text)
    return path


def by_name(bounds: list[Bound]) -> dict[str, Bound]:
    return {b.name: b for b in bounds}


def test_the_bounds_file_parses_and_every_figure_has_a_group() -> None:
    bounds = load_bounds()
    assert bounds
    assert {b.name for b in bounds} == set(bench_check.GROUP_OF)
    assert {b.kind for b in bounds} == set(bench_check.KINDS)
    for b in bounds:
        assert b.measured.strip(), b.name


def test_every_command_names_a_script_and_flags_that_exist() -> None:
    for b in load_bounds():
        words = shlex.split(b.command)
        assert words[0] == ".venv/bin/python", b.command
        script = ROOT / words[1]
        assert script.is_file(), f"{b.name}: {script} does not exist"
        source = script.read_text()
        for flag in (w for w in words[2:] if w.startswith("--")):
            assert f'"{flag}"' in source, f"{b.name}: {script.name} has no {flag} option"
        if "--cases" in words:  # a zoo's cases must be its own
            for case in words[words.index("--cases") + 1].split(","):
                assert f'"{case}"' in source, f"{b.name}: {script.name} has no case {case}"
        if "--only" in words:  # a section --only picks must be one the script knows
            for section in words[words.index("--only") + 1].split(","):
                assert f'"{section}"' in source, f"{b.name}: no section {section}"


def test_the_2_rank_cost_is_checked_with_the_rounds_its_bound_was_earned_on() -> None:
    (cost,) = [b for b in load_bounds() if b.name == "ddp-doctor-loop-cost"]
    words = shlex.split(cost.command)
    assert words[1] == "benchmarks/world_cost.py"
    assert int(words[words.index("--rounds") + 1]) == bench_check.WORLD_COST_ROUNDS


def test_the_wall_zoo_cases_checked_are_the_zoos_own() -> None:
    source = (ROOT / "benchmarks" / "wall_zoo.py").read_text()
    for case in bench_check.WALL_CASES:
        assert f'"{case}":' in source


@pytest.mark.parametrize(
    ("name", "value", "limit"),
    [
        ("cache-small-pss-4w", 1.12, "1.08"),  # memory, past 1.05 + 0.03
        ("wall-zoo-recall", 4, "5"),  # count, below 5 - 0
        ("doctor-cost", 1.21, "1.1"),  # timing, past 1.03 + 0.07
    ],
)
def test_a_regressed_figure_of_each_kind_fails_naming_figure_bound_and_command(
    tmp_path: Path, name: str, value: float, limit: str
) -> None:
    bound = by_name(load_bounds(planted(tmp_path)))[name]
    result = judge(bound, value)
    assert result.status == "FAIL"
    line = format_line(result)
    sign = "<=" if bound.direction == "max" else ">="
    first, second = line.splitlines()
    assert first.startswith(f"FAIL {name}: ")
    assert f" vs {sign} {bench_check._num(bound.bound)} " in first
    assert f"(tolerance {bench_check._num(bound.tolerance)})" in first
    assert first.endswith(f"-- {bound.command}")
    assert f"past the limit {limit};" in second
    assert f"benchmarks/bench_check.py --only {name}" in second


def test_within_the_tolerance_passes_and_the_edge_is_inclusive(tmp_path: Path) -> None:
    bounds = by_name(load_bounds(planted(tmp_path)))
    assert judge(bounds["doctor-cost"], 1.08).status == "PASS"  # past the bound, in tolerance
    assert judge(bounds["doctor-cost"], 1.10).status == "PASS"  # the limit itself
    assert judge(bounds["wall-zoo-recall"], 5).status == "PASS"
    assert judge(bounds["wall-zoo-recall"], 7).status == "PASS"  # better is fine
    line = format_line(judge(bounds["cache-small-pss-4w"], 1.036))
    assert line == (
        "PASS cache-small-pss-4w: 1.036 vs <= 1.05 (tolerance 0.03) -- "
        ".venv/bin/python benchmarks/cache.py --only small"
    )


def test_a_figure_not_measured_fails_with_the_reason(tmp_path: Path) -> None:
    bound = by_name(load_bounds(planted(tmp_path)))["doctor-cost"]
    assert judge(bound, float("nan")).status == "FAIL"
    result = judge(bound, None, "group doctor-cost exited 1: Traceback ...")
    assert result.status == "FAIL"
    assert "group doctor-cost exited 1" in format_line(result)
    assert "not measured" in format_line(judge(bound, None))


def test_check_measures_each_group_once_and_writes_one_line_per_figure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bounds = load_bounds(planted(tmp_path))
    asked: list[str] = []
    figures = {"cache-small-pss-4w": 1.04, "wall-zoo-recall": 5.0, "doctor-cost": 1.31}

    def measure(group: str) -> tuple[dict[str, float], str]:
        asked.append(group)
        return {n: v for n, v in figures.items() if bench_check.GROUP_OF[n] == group}, ""

    results, seconds = check(bounds, measure=measure)
    assert asked == ["cache-memory", "wall-zoo", "doctor-cost"]
    assert set(seconds) == set(asked)
    assert [(r.name, r.status) for r in results] == [
        ("cache-small-pss-4w", "PASS"),
        ("wall-zoo-recall", "PASS"),
        ("doctor-cost", "FAIL"),
    ]
    out = capsys.readouterr().out
    assert "PASS cache-small-pss-4w: 1.04 vs <= 1.05" in out
    assert "FAIL doctor-cost: 1.31 vs <= 1.03 (tolerance 0.07)" in out


def test_a_failed_group_shows_what_it_printed_and_a_passing_one_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A CI log must say which zoo case drew the warning that failed a count.
    bounds = load_bounds(planted(tmp_path))
    monkeypatch.setattr(bench_check, "GROUP_OUTPUT", {})
    printed = {
        "cache-memory": "cache tokens: 1.04",
        "wall-zoo": "\n".join(f"wall zoo case-{i}: fine" for i in range(30))
        + "\nwall zoo clean-workers: ['data-bound'] "
        + "x" * 500,
        "doctor-cost": "doctor 1.01",
    }
    figures = {"cache-small-pss-4w": 1.04, "wall-zoo-recall": 4.0, "doctor-cost": 1.01}

    def measure(group: str) -> tuple[dict[str, float], str]:
        bench_check.GROUP_OUTPUT[group] = printed[group]
        return {n: v for n, v in figures.items() if bench_check.GROUP_OF[n] == group}, ""

    check(bounds, measure=measure)
    out = capsys.readouterr().out
    assert "what wall-zoo printed (last 24 lines):" in out
    assert "     | wall zoo clean-workers: ['data-bound'] xxx" in out
    assert "case-29: fine" in out
    assert "case-6: fine" not in out
    assert "x" * 401 not in out  # long lines cut
    assert "cache tokens" not in out
    assert "doctor 1.01" not in out


def test_main_exits_1_on_a_fail_and_writes_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = planted(tmp_path)

    def measure(group: str) -> tuple[dict[str, float], str]:
        return {"cache-small-pss-4w": 1.2, "wall-zoo-recall": 5.0}, ""

    monkeypatch.setattr(bench_check, "measure_in_child", measure)
    out = tmp_path / "out.json"
    code = bench_check.main(["--bounds", str(path), "--stable", "--json", str(out)])
    assert code == 1
    data = json.loads(out.read_text())
    assert [(r["name"], r["status"]) for r in data["results"]] == [
        ("cache-small-pss-4w", "FAIL"),
        ("wall-zoo-recall", "PASS"),
    ]  # --stable: no timing figure
    assert "FAILED: cache-small-pss-4w" in capsys.readouterr().out
    assert bench_check.main(["--bounds", str(path), "--only", "wall-zoo-recall"]) == 0


def test_select_only_and_stable(tmp_path: Path) -> None:
    bounds = load_bounds(planted(tmp_path))
    names = [b.name for b in bench_check.select(bounds, stable=True, only="")]
    assert names == ["cache-small-pss-4w", "wall-zoo-recall"]
    assert [b.name for b in bench_check.select(bounds, False, "doctor-cost")] == ["doctor-cost"]
    assert [b.name for b in bench_check.select(bounds, False, "cache-memory")] == [
        "cache-small-pss-4w"
    ]  # a group's name picks its figures
    with pytest.raises(SystemExit, match="unknown figure"):
        bench_check.select(bounds, False, "no-such-figure")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (('kind = "count"', 'kind = "speed"'), "`kind` must be one of"),
        (('direction = "min"', 'direction = "up"'), "`direction` must be one of"),
        (("tolerance = 0\n", "tolerance = -1\n"), "`tolerance` must be >= 0"),
        (('measured = "planted"\n', "\n"), "`measured` missing"),
        (("bound = 5\n", 'bound = "5"\n'), "`bound` missing or of the wrong type"),
        (('name = "doctor-cost"', 'name = "wall-zoo-recall"'), "used twice"),
        (('measured = "planted"\n', 'measured = "planted"\nowner = "x"\n'), "unknown field"),
    ],
)
def test_a_malformed_bounds_file_is_refused_saying_why(
    tmp_path: Path, edit: tuple[str, str], message: str
) -> None:
    old, new = edit
    assert old in PLANTED
    with pytest.raises(ValueError, match=message):
        load_bounds(planted(tmp_path, PLANTED.replace(old, new, 1)))


def test_an_open_regression_is_reported_open_not_failed_and_its_return_is_announced(
    tmp_path: Path,
) -> None:
    text = PLANTED.replace(
        'measured = "planted"\n',
        'measured = "planted"\n'
        'open_regression = "issue 38: the arena stores a header per sample"\n',
        1,
    )
    bound = by_name(load_bounds(planted(tmp_path, text)))["cache-small-pss-4w"]
    past = judge(bound, 1.4)
    assert past.status == "OPEN"
    assert "an open regression, issue 38: the arena stores a header per sample" in format_line(past)
    back = judge(bound, 1.0)
    assert back.status == "PASS"
    assert "remove `open_regression`" in format_line(back)
    assert judge(bound, None).status == "FAIL"  # not measured is never excused
    bad = text.replace('open_regression = "issue 38', "open_regression = 38 #", 1)
    with pytest.raises(ValueError, match="open_regression"):
        load_bounds(planted(tmp_path, bad))

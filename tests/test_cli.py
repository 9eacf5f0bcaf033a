"""The stepwatch command: in-process through main(), plus real subprocesses for both entry points."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from stepwatch import Stopwatch
from stepwatch.cli import main

from .conftest import PYTHON, FakeClock, subprocess_env


@pytest.fixture
def saved(tmp_path: Path, clock: FakeClock) -> Path:
    sw = Stopwatch(clock=clock)
    sw.enable()
    for _ in sw.timed_iter(range(4)):
        with sw.timed("forward"):
            clock.advance(2_000_000)
        sw.count(samples=8)
    path = tmp_path / "run.json"
    sw.save(path)
    return path


def test_report_prints_the_table(saved: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(saved)]) == 0
    out = capsys.readouterr().out
    assert "forward" in out and "samples/s" in out and "% time" in out


@pytest.mark.parametrize(
    ("content", "reason"), [(b"", "empty file"), (b"{", "truncated JSON"), (b'{"a": 1}', "not a stepwatch run")]
)
def test_bad_file_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, reason: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    assert main(["report", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and reason in err and str(path) in err


def test_missing_file_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path / "nope.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot read" in err


def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["frobnicate"]) == 2
    assert main([]) == 2


def test_export_guesses_format_from_extension(saved: Path, tmp_path: Path) -> None:
    out = tmp_path / "steps.tsv"
    assert main(["export", str(saved), "-o", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert lines[0].split("\t")[:3] == ["train:loader", "train:step", "train:step/forward"]
    assert len(lines) == 4  # a header and the 3 steps after the first


def test_export_explicit_format_to_stdout(saved: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", str(saved), "--format", "json"]) == 0
    assert '"format": "stepwatch"' in capsys.readouterr().out


@pytest.mark.parametrize("command", [["stepwatch"], [PYTHON, "-m", "stepwatch"]])
def test_real_subprocess_entry_points(saved: Path, tmp_path: Path, command: list[str]) -> None:
    if command == ["stepwatch"]:
        command = [str(Path(PYTHON).parent / "stepwatch")]
    good = subprocess.run([*command, "report", str(saved)], env=subprocess_env(), capture_output=True, text=True)
    assert good.returncode == 0 and "forward" in good.stdout
    bad_path = tmp_path / "bad.json"
    bad_path.write_text("not json at all")
    bad = subprocess.run([*command, "report", str(bad_path)], env=subprocess_env(), capture_output=True, text=True)
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0 and "not valid JSON" in bad.stderr
    assert "Traceback" not in bad.stderr


# -- compare as a CI gate, bad arguments, crafted files ---------------------------------------------------------


@pytest.fixture
def empty_run(tmp_path: Path) -> Path:
    sw = Stopwatch()
    sw.enable()
    with sw.timed("setup"):  # recorded something, but no loop: no steps to compare
        pass
    path = tmp_path / "empty.json"
    sw.save(path)
    return path


def test_gate_fails_when_a_run_measured_no_steps(
    saved: Path, empty_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["compare", str(saved), str(empty_run), "--fail-if-slower", "5"]) == 2
    assert "measured no steps" in capsys.readouterr().err
    assert main(["compare", str(empty_run), str(saved), "--fail-if-slower", "5"]) == 2
    assert main(["compare", str(saved), str(saved), "--fail-if-slower", "5"]) == 0


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "-inf"])
def test_gate_percentage_must_be_finite_and_not_negative(
    saved: Path, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["compare", str(saved), str(saved), f"--fail-if-slower={value}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "0 or more" in err


def test_unknown_stage_is_an_error_with_or_without_the_gate(saved: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", str(saved), str(saved), "--stage", "nope"]) == 2
    assert "no stage named nope" in capsys.readouterr().err
    assert main(["compare", str(saved), str(saved), "--stage", "forward"]) == 0


@pytest.mark.parametrize(
    "field",
    [
        '"loop_ns": 1e400',
        f'"window": {10**30}',
        '"cpu_count": "x"',
        '"elapsed": NaN',
        '"devices": 5',
        # terminal escapes and forged lines: clear the screen, set the title, print a fake verdict
        '"auto": "\\u001b[2J\\u001b[Hverdict: all good"',
        '"device_error": "oops\\nverdict: compute-bound"',
        '"devices": ["\\u001b]0;pwned\\u0007cuda:0"]',
    ],
)
def test_crafted_file_is_one_line_and_exit_2_from_every_command(
    saved: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str
) -> None:
    key = field.split(":")[0]
    text = saved.read_text()
    assert key in text
    crafted = tmp_path / "crafted.json"
    crafted.write_text(text.replace(key + ":", field + ', "was":', 1))
    for command in (
        ["report", str(crafted)],
        ["export", str(crafted), "--format", "json"],
        ["export", str(crafted), "--format", "tsv"],
        ["compare", str(crafted), str(saved)],
        ["compare", str(saved), str(crafted), "--fail-if-slower", "5"],
    ):
        capsys.readouterr()
        assert main(command) == 2, command
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "crafted.json" in err, err


@pytest.mark.parametrize(
    "arguments",
    [["--epochs", "-1"], ["--samples", "0"], ["--batch-size", "0"], ["--workers", "-3"], ["--workers", "0"]],
)
def test_demo_refuses_bad_values_in_one_line(arguments: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["demo", *arguments])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "out of range" in err and "Traceback" not in err


def test_export_csv_is_a_real_format(saved: Path, tmp_path: Path) -> None:
    import csv

    out = tmp_path / "steps.csv"
    assert main(["export", str(saved), "-o", str(out)]) == 0
    rows = list(csv.reader(out.open()))
    tsv = tmp_path / "steps.tsv"
    assert main(["export", str(saved), "-o", str(tsv)]) == 0
    assert rows == [line.split("\t") for line in tsv.read_text().splitlines()]
    assert rows[0][:2] == ["train:loader", "train:step"]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [(["-o", "steps.xlsx"], "cannot tell the format"), (["-o", "steps.tsv", "--format", "json"], "does not match")],
)
def test_export_unknown_or_mismatched_extension_is_an_error(
    saved: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], arguments: list[str], message: str
) -> None:
    arguments = [str(tmp_path / a) if a.startswith("steps.") else a for a in arguments]
    assert main(["export", str(saved), *arguments]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not list(tmp_path.glob("steps.*"))


def loop_run(tmp_path: Path, clock: FakeClock, name: str, phases: dict[str, int]) -> Path:
    sw = Stopwatch(clock=clock)
    sw.enable()
    for phase, step_ns in phases.items():
        for _ in sw.timed_iter(range(4), phase=phase):
            clock.advance(step_ns)
    path = tmp_path / name
    sw.save(path)
    return path


def test_compare_goes_phase_by_phase_and_names_them(
    tmp_path: Path, clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    train_only = loop_run(tmp_path, clock, "train.json", {"train": 2_000_000})
    val_only = loop_run(tmp_path, clock, "val.json", {"val": 1_000_000})
    for gate in ([], ["--fail-if-slower", "5"]):
        assert main(["compare", str(train_only), str(val_only), *gate]) == 2  # never val against train
        err = capsys.readouterr().err
        assert "nothing to compare" in err and "val" in err and "train" in err
    both_a = loop_run(tmp_path, clock, "a.json", {"train": 2_000_000, "val": 1_000_000})
    both_b = loop_run(tmp_path, clock, "b.json", {"train": 2_000_000, "val": 3_000_000})
    assert main(["compare", str(both_a), str(both_b), "--fail-if-slower", "5"]) == 0  # train is the gate
    out = capsys.readouterr().out
    assert "(phase train, per call)" in out and "(phase val, per call)" in out
    assert "+200.0%" in out.split("(phase val")[1]  # the val step tripled, shown in its own table


@pytest.mark.parametrize(("command", "name"), [("export", "x.html"), ("export", "x.json.gz"), ("plot", "x.png")])
def test_a_failed_write_leaves_the_file_that_was_there(saved: Path, tmp_path: Path, command: str, name: str) -> None:
    """Written atomically, as runs are: the write fails past a file-size limit (``ulimit -f``), and the good
    file written before is left whole; one line, exit 2."""
    import resource

    target = tmp_path / name
    good = subprocess.run(
        [PYTHON, "-m", "stepwatch", command, str(saved), "-o", str(target)],
        env=subprocess_env(),
        capture_output=True,
        text=True,
    )
    assert good.returncode == 0, good.stderr
    before = target.read_bytes()

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (200, 200))

    limited = subprocess.run(
        [PYTHON, "-m", "stepwatch", command, str(saved), "-o", str(target)],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        preexec_fn=small_files,
    )
    assert limited.returncode == 2 and "cannot write" in limited.stderr, limited.stderr
    assert len(limited.stderr.strip().splitlines()) == 1
    assert target.read_bytes() == before and len(before) > 200
    assert [path.name for path in tmp_path.iterdir() if path.name.startswith(".stepwatch-")] == []


def test_compare_places_a_stage_one_run_lacks_under_its_parent(tmp_path: Path, clock: FakeClock) -> None:
    """A stage only the later run has is listed under its parent, before that parent's ``other``, not as a
    parentless row at the end."""

    def record(path: Path, stages: tuple[str, ...]) -> None:
        sw = Stopwatch(clock=clock)
        sw.enable()
        for _ in sw.timed_iter(range(3)):
            for stage in stages:
                with sw.timed(stage):
                    clock.advance(1_000_000)
        sw.save(path)

    record(tmp_path / "a.json", ("forward",))
    record(tmp_path / "b.json", ("decode", "forward"))
    result = subprocess.run(
        [PYTHON, "-m", "stepwatch", "compare", "a.json", "b.json"],
        cwd=tmp_path,
        env=subprocess_env(),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    names = [line.split()[0] for line in result.stdout.splitlines()[2:] if line.startswith("  ")]
    assert names.index("decode") < names.index("other") and names[-1] != "decode", result.stdout

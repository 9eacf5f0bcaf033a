"""What a notebook shows: ``_repr_html_`` and ``_repr_pretty_`` of a run, a loaded run, the ranks of a job and a
comparison, called directly, through IPython's display machinery, and in a real notebook run by ``nbclient``."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from IPython.core.formatters import DisplayFormatter
from IPython.lib.pretty import pretty
from nbclient import NotebookClient

import stepwatch
from stepwatch import AllRanks, Compared, Stopwatch, Summary

from .conftest import FakeClock, rank_runs, stepwatch_command, subprocess_env

MS = 1_000_000


def recorded(clock: FakeClock, forward_ms: int, steps: int = 6) -> Summary:
    sw = Stopwatch(clock=clock)
    sw.enable()
    for _ in sw.timed_iter(range(steps)):
        clock.advance(MS)
        with sw.timed("forward"):
            clock.advance(forward_ms * MS)
        sw.count(samples=4)
    return sw.summary()


def assert_self_contained(html: str) -> None:
    """One fragment: its style scoped to it, no script, nothing fetched, no plots."""
    assert html.startswith('<div class="stepwatch"><style>') and html.endswith("</div>")
    style = re.search(r"<style>(.*?)</style>", html, re.S)
    assert style is not None
    rules = re.findall(r"([^{}]+)\{", style.group(1))
    assert rules and all(rule.strip().startswith(".stepwatch") for rule in rules), rules
    assert "<script" not in html and "http://" not in html and "https://" not in html and "<svg" not in html
    assert "<html" not in html and "<body" not in html


def test_a_run_shows_its_tables_and_verdict(tmp_path: Path, clock: FakeClock) -> None:
    summary = recorded(clock, forward_ms=3)
    html = summary._repr_html_()
    assert_self_contained(html)
    assert 'data-path="step/forward"' in html and "verdict" in html
    assert summary.verdict.headline in html.replace("&#x27;", "'")
    assert pretty(summary) == stepwatch.render(summary).rstrip("\n") == summary.render().rstrip("\n")

    path = tmp_path / "run.json"
    path.write_text(stepwatch.render(summary, "json"))
    loaded = stepwatch.load(path)
    assert isinstance(loaded, Summary)
    assert loaded._repr_html_() == html and pretty(loaded) == pretty(summary)


def test_ipython_display_machinery_picks_both_forms(clock: FakeClock) -> None:
    summary = recorded(clock, forward_ms=3)
    formats, _ = DisplayFormatter().format(summary)
    assert formats["text/html"] == summary._repr_html_()
    assert formats["text/plain"] == summary.render().rstrip("\n")


def test_the_ranks_of_a_job_show_the_straggler(clock: FakeClock) -> None:
    job = AllRanks(tuple(rank_runs(clock, [2, 9], steps=5)), 2)
    html = job._repr_html_()
    assert_self_contained(html)
    assert "all ranks" in html and "straggler: rank 1" in html and 'data-rank="1"' in html
    assert pretty(job) == job.render().rstrip("\n")


def test_a_comparison_shows_what_changed_as_the_cli_prints_it(tmp_path: Path, clock: FakeClock) -> None:
    before, after = recorded(clock, forward_ms=6), recorded(clock, forward_ms=2)
    for name, run in (("before.json", before), ("after.json", after)):
        (tmp_path / name).write_text(stepwatch.render(run, "json"))
    compared = stepwatch.compare(tmp_path / "before.json", tmp_path / "after.json")
    assert isinstance(compared, Compared) and compared.names == (
        str(tmp_path / "before.json"),
        str(tmp_path / "after.json"),
    )
    cli = stepwatch_command("compare", "before.json", "after.json", cwd=tmp_path)
    assert cli.returncode == 0, cli.stderr
    assert stepwatch.compare(before, after, names=("before.json", "after.json")).render() == cli.stdout
    html = compared._repr_html_()
    assert_self_contained(html)
    assert 'data-path="step/forward"' in html and "-66.7%" in html  # 6 ms -> 2 ms
    assert pretty(compared) == compared.render().rstrip("\n")
    assert compared.slower_than(1.0) == [] and stepwatch.compare(after, before).slower_than(1.0)


def test_compare_refuses_what_it_cannot_compare(clock: FakeClock) -> None:
    with pytest.raises(ValueError, match="nothing to compare"):
        stepwatch.compare(recorded(clock, 1), Summary({}))
    with pytest.raises(TypeError, match="compare takes runs"):
        stepwatch.compare(recorded(clock, 1), 42)  # type: ignore[arg-type]


def without_wall_time(shown: str) -> str:
    return re.sub(r'<p class="meta">.*?</p>|\nrun: [^\n]*', "", shown)


NOTEBOOK_CELLS = [
    """import time
import stepwatch
sw = stepwatch.Stopwatch()
sw.enable()
for _ in sw.timed_iter(range(5)):
    with sw.timed("forward"):
        time.sleep(0.002)
    sw.count(samples=8)
sw.save("run.json")
sw.summary()""",
    "stepwatch.load('run.json')",
    "stepwatch.compare('run.json', 'run.json')",
]


@pytest.mark.slow
def test_a_real_notebook_displays_them(tmp_path: Path) -> None:
    """A notebook run by nbclient on a real kernel: each cell's last value shows as HTML, with the text form."""
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in NOTEBOOK_CELLS])
    NotebookClient(
        notebook, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute(env=subprocess_env())
    outputs = [cell.outputs for cell in notebook.cells]
    assert all(len(cell_outputs) == 1 and cell_outputs[0].output_type == "execute_result" for cell_outputs in outputs)
    run, loaded, compared = (cell_outputs[0].data for cell_outputs in outputs)
    assert run["text/html"].startswith('<div class="stepwatch">') and "verdict" in run["text/html"]
    assert run["text/plain"].startswith("stepwatch · train · 4 steps")
    # the same tables: the run's wall time alone moved on between the save and the summary
    assert without_wall_time(loaded["text/html"]) == without_wall_time(run["text/html"])
    assert without_wall_time(loaded["text/plain"]) == without_wall_time(run["text/plain"])
    assert "stepwatch compare" in compared["text/html"] and "+0.0%" in compared["text/plain"]

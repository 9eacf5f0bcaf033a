"""Plots and the one-file HTML report, drawn from real recorded runs; the page opened in headless Chromium."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
from html import escape
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import stepwatch
from stepwatch._gather import _decode as decode
from stepwatch._gather import _encode as encode
from stepwatch._render import plot as _plot
from stepwatch._render.html import render_html
from stepwatch.distributed import AllRanks

from .conftest import PYTHON, FakeClock, rank_runs, spin, subprocess_env


class Busy(Dataset[tuple[torch.Tensor, int]]):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        spin(0.0003)
        return torch.full((4,), float(index)), index % 2


@pytest.fixture(scope="module")
def run() -> stepwatch.Summary:
    """A real run: 2 forked DataLoader workers, a train and a val phase."""
    sw = stepwatch.Stopwatch()
    sw.enable()
    for _ in range(2):
        for x, _y in sw.watch(DataLoader(Busy(), batch_size=8, num_workers=2, multiprocessing_context="fork")):
            with sw.timed("forward"):
                spin(0.001)
            with sw.timed("backward"):
                spin(0.0005)
            sw.count(samples=len(x))
        for _ in sw.watch(
            DataLoader(Busy(), batch_size=16, num_workers=2, multiprocessing_context="fork"), phase="val"
        ):
            with sw.timed("forward"):
                spin(0.0005)
    return sw.summary()


def ranks_job(clock: FakeClock) -> AllRanks:
    return AllRanks(tuple(rank_runs(clock, (2, 6, 2), steps=6)), 3)


def test_the_run_figure_draws_each_phase_each_stage_and_each_worker(run: stepwatch.Summary, tmp_path: Path) -> None:
    figure = _plot.run_figure(run)
    left, middle, right = figure.axes
    parts = {label for phase in run.phases.values() for label in _plot.breakdown(phase)}
    assert len(left.patches) == len(run.phases) * len(parts)  # one segment per part and phase (0 where absent)
    assert [tick.get_text() for tick in left.get_xticklabels()] == ["train", "val"]
    heights = {p.get_x(): 0.0 for p in left.patches}
    for patch in left.patches:
        heights[patch.get_x()] += patch.get_height()
    for height, phase in zip([heights[x] for x in sorted(heights)], run.phases.values(), strict=True):
        assert height == pytest.approx(phase.measured / phase.steps * 1e3, rel=1e-6)  # each bar is its phase's step
    train = run.phases["train"]
    assert len(middle.lines) == 2 and len(middle.lines[0].get_xdata()) == min(train.steps, 1024)
    assert len(right.patches) == 2 * len(train.workers) == 4  # busy, and the part of it on the CPU
    busy, on_cpu = right.patches[:2], right.patches[2:]
    for worker, whole, part in zip(train.workers.values(), busy, on_cpu, strict=True):
        assert whole.get_height() == pytest.approx(worker.utilization * 100)
        assert part.get_height() == pytest.approx(worker.utilization * worker.cpu_share * 100)
        assert part.get_height() <= whole.get_height()
    _plot.save(figure, str(tmp_path / "run.png"))
    import matplotlib.image

    pixels = matplotlib.image.imread(str(tmp_path / "run.png"))
    assert pixels.shape[:2] == (616, 1760) and pixels[..., :3].std() > 0.05  # drawn, not blank


def test_all_ranks_and_comparison_figures(run: stepwatch.Summary, clock: FakeClock) -> None:
    figure = _plot.run_figure(ranks_job(clock))
    left = figure.axes[0]
    assert [tick.get_text() for tick in left.get_xticklabels()] == ["rank 0", "rank 1", "rank 2"]
    stacks = {p.get_x(): 0.0 for p in left.patches}
    for patch in left.patches:
        stacks[patch.get_x()] += patch.get_height()
    assert sorted(stacks.values()) == pytest.approx([3.0, 3.0, 7.0])  # 1 ms wait + forward, per step
    _plot.pyplot().close(figure)
    comparison = _plot.comparison_figure(run, ranks_job(clock).runs[1], "before", "after")
    axes = comparison.axes[0]
    stages = [label.get_text() for label in axes.get_yticklabels()]
    assert len(axes.patches) == 2 * len(stages) and "step/forward" in stages and "loader/dataset" in stages
    _plot.pyplot().close(comparison)


def test_stepwatch_plot_writes_png_and_svg_and_refuses_bad_requests(run: stepwatch.Summary, tmp_path: Path) -> None:
    stepwatch._run_file.save_summary(run, tmp_path / "a.json")
    for name in ("a.png", "a.svg", "diff.png"):
        files = ["a.json", "a.json"] if name == "diff.png" else ["a.json"]
        result = subprocess.run(
            [PYTHON, "-m", "stepwatch", "plot", *files, "-o", name],
            cwd=tmp_path,
            env=subprocess_env(),
            capture_output=True,
            text=True,
        )
        assert result.returncode == 0, result.stderr
        assert (tmp_path / name).stat().st_size > 20_000
    assert (tmp_path / "a.svg").read_text().count("<path") > 50
    for args, message in (
        (["a.json", "-o", "a.gif"], "use .png, .svg or .pdf"),
        (["a.json", "a.json", "a.json", "-o", "x.png"], "one run, or two"),
        (["missing.json", "-o", "x.png"], "cannot read"),
    ):
        result = subprocess.run(
            [PYTHON, "-m", "stepwatch", "plot", *args],
            cwd=tmp_path,
            env=subprocess_env(),
            capture_output=True,
            text=True,
        )
        assert result.returncode == 2 and message in result.stderr and result.stderr.count("\n") == 1


class Tables(HTMLParser):
    """The rows of every table, by the table's class, with each row's data attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[tuple[dict[str, str | None], list[tuple[dict[str, str | None], list[str]]]]] = []
        self.tags: list[str] = []
        self.cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        if tag == "table":
            self.tables.append((dict(attrs), []))
        elif tag == "tr":
            self.tables[-1][1].append((dict(attrs), []))
        elif tag == "td":
            self.cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self.cell is not None:
            self.tables[-1][1][-1][1].append("".join(self.cell).strip())
            self.cell = None

    def handle_data(self, data: str) -> None:
        if self.cell is not None:
            self.cell.append(data)


def test_the_html_report_carries_the_summarys_numbers_and_needs_nothing_from_outside(run: stepwatch.Summary) -> None:
    page = render_html(run, "run.json")
    parser = Tables()
    parser.feed(page)
    stages = {table["data-phase"]: rows for table, rows in parser.tables if table.get("class") == "stages"}
    assert set(stages) == {"train", "val"}
    for name, rows in stages.items():
        phase = run.phases[name]
        by_path = {attrs["data-path"]: cells for attrs, cells in rows if attrs.get("data-path")}
        assert set(by_path) == set(phase.stages)
        for path, cells in by_path.items():
            stage = phase.stages[path]
            assert int(cells[1]) == stage.calls
            assert float(cells[3]) == pytest.approx(stage.mean * 1e3, abs=0.0005)
    workers = [rows for table, rows in parser.tables if table.get("class") == "workers"]
    assert len(workers) == 2 and all(len([r for r in rows if r[0].get("data-worker")]) == 2 for rows in workers)
    assert page.count("<svg") == 1 and "verdict" in page and escape(run.verdict.headline) in page
    assert not {"script", "link", "img", "iframe"} & set(parser.tags)  # nothing to fetch, nothing to run
    assert not re.search(r"url\(\s*['\"]?(?!#)", page) and "@import" not in page  # only the SVG's own #ids
    assert not re.search(r"(src|href)\s*=\s*['\"]?(https?:|//)", page)


def test_the_html_report_says_what_the_text_report_says(run: stepwatch.Summary) -> None:
    """Worker-side rows keep their [w] marker (and the page says what their share is of), and the ``auto:``
    line of what auto-instrumentation found is there, as the text report's first line."""
    found = "auto: DataLoader (2 workers), forward: Net, backward"
    page = render_html(dataclasses.replace(run, metadata={**run.metadata, "auto": found}), "run.json")
    parser = Tables()
    parser.feed(page)
    text = stepwatch.render(run)
    for table, rows in parser.tables:
        if table.get("class") != "stages":
            continue
        for attrs, cells in rows:
            if attrs.get("data-path"):
                stage = run.phases[table["data-phase"]].stages[attrs["data-path"]]
                assert cells[0].strip().endswith("[w]") == stage.in_workers, attrs["data-path"]
    assert "dataset [w]" in text and "share of the workers' busy time" in page
    assert escape(found) in page


def test_every_rank_is_on_the_time_panel_and_stages_keep_their_colours(
    run: stepwatch.Summary, clock: FakeClock
) -> None:
    """A gathered all-ranks file keeps no window for ranks other than 0: each still gets its line (its mean).
    A stage is drawn in the same colour whatever else the run recorded."""
    job = ranks_job(clock)
    without_windows = [job.runs[0]] + [decode(encode(r, False)) for r in job.runs[1:]]  # as the gather sends them
    figure = _plot.run_figure(AllRanks(tuple(without_windows), 3))
    middle = figure.axes[1]
    assert [line.get_label() for line in middle.lines] == [
        "rank 0",
        "rank 1 (mean: no window kept)",
        "rank 2 (mean: no window kept)",
    ]
    rank_2 = without_windows[2].main_phase
    assert middle.lines[2].get_ydata()[0] == pytest.approx(rank_2.measured / rank_2.steps * 1e3) == 3.0
    _plot.pyplot().close(figure)

    def colours(summary: stepwatch.Summary) -> dict[str, str]:
        figure = _plot.run_figure(summary)
        left = figure.axes[0]
        handles, labels = left.get_legend_handles_labels()
        found = {label: handle.patches[0].get_facecolor() for handle, label in zip(handles, labels, strict=True)}
        _plot.pyplot().close(figure)
        return {name: matplotlib.colors.to_hex(colour) for name, colour in found.items()}

    import matplotlib.colors

    first, second = colours(run), colours(job.runs[1])
    assert first["step/forward"] == second["step/forward"] == _plot.STAGE_COLORS["step/forward"].lower()
    assert first["loader"] == second["loader"]
    assert len(set(first.values())) == len(first)  # the stages of one picture stay apart


def test_the_all_ranks_html_report(clock: FakeClock) -> None:
    page = render_html(ranks_job(clock), "ddp.json")
    parser = Tables()
    parser.feed(page)
    ranks = next(rows for table, rows in parser.tables if table.get("class") == "ranks")
    assert [cells[0] for attrs, cells in ranks if attrs.get("data-rank")] == ["0", "1", "2"]
    assert "straggler: rank 1, step/forward" in page and "3 of 3 ranks" in page


def chromium() -> str:
    found = shutil.which("chromium")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing: .ci/run installs Debian's chromium package")
        pytest.skip("Debian's chromium is not installed here (apt-get install chromium)")
    return found


HEADLESS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]


def open_in_chromium(page: Path, folder: Path) -> tuple[Path, int]:
    """Opens ``page`` in headless Chromium: its screenshot, and how many requests the page itself made (from
    Chromium's net log: a request a document initiated has an origin, the browser's own have none)."""
    shot, netlog = folder / f"{page.stem}.png", folder / f"{page.stem}.netlog.json"
    command = [
        chromium(),
        *HEADLESS,
        f"--user-data-dir={folder / (page.stem + '-profile')}",
        "--window-size=1280,2600",
        f"--screenshot={shot}",
        f"--log-net-log={netlog}",
        page.as_uri(),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert shot.exists(), result.stderr[-2000:]
    log = json.loads(netlog.read_text())
    start = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    from_page = [
        event
        for event in log["events"]
        if event["type"] == start and event.get("params", {}).get("initiator", "not an origin") != "not an origin"
    ]
    return shot, len(from_page)


@pytest.mark.slow
def test_the_html_report_in_a_real_browser_shows_tables_and_plots_and_fetches_nothing(
    run: stepwatch.Summary, tmp_path: Path
) -> None:
    control = tmp_path / "control.html"  # the check can see a page's request: this page makes two
    control.write_text('<img src="http://198.51.100.7/a.png"><link rel="stylesheet" href="https://198.51.100.7/a.css">')
    assert open_in_chromium(control, tmp_path)[1] >= 1
    page = tmp_path / "report.html"
    page.write_text(render_html(run, "run.json"), encoding="utf-8")
    shot, requests = open_in_chromium(page, tmp_path)
    assert requests == 0
    import matplotlib.image

    pixels = matplotlib.image.imread(str(shot))
    assert pixels.shape[:2] == (2600, 1280)
    rows_with_ink = (pixels[..., :3].min(axis=2) < 0.5).any(axis=1).sum()
    assert rows_with_ink > 800  # the tables and the plots are drawn down the page


def test_names_with_dollars_and_underscores_are_drawn_literally(tmp_path: Path) -> None:
    """A ``$`` in a stage, phase, file name or title is no math text (``$\\frac$`` made matplotlib raise,
    ``a$b$`` drew a wrong label), and a stage named ``_x`` keeps its legend entry."""
    sw = stepwatch.Stopwatch()
    sw.enable()
    for _ in sw.timed_iter(range(4), phase="p$q"):
        for name in (r"$\frac$", "a$b$", "_hidden"):
            with sw.timed(name):
                spin(0.0002)
    summary = sw.summary()
    figure = _plot.run_figure(summary, title=r"run $\frac$.json")
    labels = figure.axes[0].get_legend_handles_labels()[1]
    assert {r"step/\$\frac\$", r"step/a\$b\$", "step/_hidden"} <= set(labels)
    _plot.save(figure, str(tmp_path / "x.png"))  # drawn: no math text parsed
    page = stepwatch.render(summary, "html")
    assert escape(r"$\frac$") in page and "<svg" in page
    stepwatch._run_file.save_summary(summary, tmp_path / "$x$.json")
    for command, out in (("plot", "$x$.png"), ("export", "$x$.html")):
        result = subprocess.run(
            [PYTHON, "-m", "stepwatch", command, "$x$.json", "-o", out],
            cwd=tmp_path,
            env=subprocess_env(),
            capture_output=True,
            text=True,
        )
        assert result.returncode == 0, result.stderr
        assert (tmp_path / out).stat().st_size > 1000


def test_many_stages_and_many_ranks_are_folded_in_pictures_and_pages(clock: FakeClock) -> None:
    """10,000 stages (the documented cap) and 200 ranks: the largest are drawn and the rest folded into one
    part, one row, one bar or one line, so pictures stay under 2,000 px tall and legends fit."""
    sw = stepwatch.Stopwatch(clock=clock)
    sw.enable()
    for step in sw.timed_iter(range(3)):
        if step == 0:
            continue  # the one-off first step: the stages are made in the steady state
        for index in range(9_990):
            with sw.timed(f"batch_{index}"):
                clock.advance(1_000 + index)  # batch_9989 is the largest
    many = sw.summary()
    assert len(many.main_phase.stages) > 9_990
    figure = _plot.run_figure(many)
    labels = figure.axes[0].get_legend_handles_labels()[1]
    assert len(labels) == _plot.MAX_PARTS and _plot.FOLDED in labels and "step/batch_9989" in labels
    _plot.pyplot().close(figure)
    comparison = _plot.comparison_figure(many, many, "a", "b")
    height = comparison.get_size_inches()[1] * 110  # the dpi pictures are saved at
    ticks = [label.get_text() for label in comparison.axes[0].get_yticklabels()]
    assert height < 2000 and len(ticks) == _plot.MAX_ROWS and ticks[0].endswith("smaller stages (not drawn)")
    _plot.pyplot().close(comparison)
    page = render_html(many, "many.json", plots=False)
    parser = Tables()
    parser.feed(page)
    rows = [r for table, rows in parser.tables if table.get("class") == "stages" for r in rows if r[0]]
    assert len(rows) <= 201 and "smaller stages, folded" in page and 'data-path="step/batch_9989"' in page

    job = AllRanks(tuple(rank_runs(clock, [2] * 199 + [9], steps=4)), 200)
    figure = _plot.run_figure(job)
    left, middle = figure.axes[0], figure.axes[1]
    bars = [tick.get_text() for tick in left.get_xticklabels()]
    assert len(bars) == _plot.MAX_RANKS and "rank 199" in bars and bars[-1] == "185 other ranks (mean)"
    lines = [line.get_label() for line in middle.lines]
    assert len(lines) == _plot.MAX_LINES and "rank 199" in lines and lines[-1].startswith("193 other ranks")
    _plot.pyplot().close(figure)

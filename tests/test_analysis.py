"""Verdicts on controlled workloads, the advice's worker estimate, and comparing runs."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from torch.utils.data import DataLoader, Dataset

import stepwatch
from stepwatch import Stopwatch, Summary
from stepwatch._analysis import analyze, compare
from stepwatch.cli import main

from .conftest import PYTHON, FakeClock, spin, subprocess_env
from .fake_device import FakeDevice

MS = 1_000_000


def on_cores(summary: Summary, cores: int, gpu: bool = False) -> Summary:
    """The same figures as seen on a machine with ``cores`` cores, training on a GPU or on the CPU only (the
    advice depends on both)."""
    devices = ["cuda:0 Test GPU"] if gpu else ["cpu x86_64"]
    return dataclasses.replace(summary, metadata={**summary.metadata, "cpu_count": cores, "devices": devices})


def with_loader(summary: Summary, **config: object) -> Summary:
    """The same figures from a loader configured with ``config``."""
    loaders = {"train": {**(summary.metadata.get("loaders") or {}).get("train", {}), **config}}
    return dataclasses.replace(summary, metadata={**summary.metadata, "loaders": loaders})


def slow_data(clock: FakeClock, steps: int, wait: int) -> Iterator[int]:
    """``steps`` items, each taking ``wait`` ns to arrive."""
    for i in range(steps):
        clock.advance(wait)
        yield i


def cpu_loop(clock: FakeClock, steps: int, wait: int, stages: dict[str, int]) -> Stopwatch:
    sw = Stopwatch(clock=clock, warmup=1)
    sw.enable()
    for _ in sw.timed_iter(slow_data(clock, steps, wait)):
        for name, ns in stages.items():
            with sw.timed(name):
                clock.advance(ns)
        sw.count(samples=8)
    return sw


def test_input_bound_on_cpu(clock: FakeClock) -> None:
    sw = cpu_loop(clock, 20, 10 * MS, {"forward": MS, "backward": MS})
    verdict = analyze(on_cores(sw.summary(), 16))
    assert (verdict.kind, verdict.degree) == ("input-bound", "highly")
    assert verdict.figures["input_share"] == pytest.approx(10 / 12)
    assert "waited for data 83.3%" in verdict.headline and "highly > 20%" in verdict.headline
    assert verdict.figures["workers_needed"] == 5  # 10 ms of loading per 2 ms step
    assert any("num_workers=5" in advice for advice in verdict.advice)


def test_worker_advice_respects_the_cores(clock: FakeClock) -> None:
    sw = cpu_loop(clock, 20, 10 * MS, {"forward": MS, "backward": MS})
    (advice, *_) = analyze(with_loader(on_cores(sw.summary(), 2, gpu=True), num_workers=0)).advice
    assert advice.startswith("use DataLoader(num_workers=1) (now 0), the most this 2-core machine can spare")
    assert "hiding the wait fully would take 5" in advice  # one recommendation, and why it is not 5


def test_on_the_cpu_workers_compete_with_torch_threads(clock: FakeClock) -> None:
    sw = cpu_loop(clock, 20, 10 * MS, {"forward": MS, "backward": MS})
    summary = with_loader(on_cores(sw.summary(), 2), torch_threads=2, num_workers=0)
    (advice, *_) = analyze(summary).advice
    assert advice.startswith("try num_workers=1 (now 0) with torch.set_num_threads(1): on the CPU, workers share")
    assert "keep it only if `stepwatch compare` shows a shorter time per step" in advice
    (advice, *_) = analyze(with_loader(summary, torch_threads=1)).advice
    assert advice.startswith("try num_workers=1 (now 0): on the CPU, workers share the 2 cores with torch's 1")


def test_without_the_loaders_configuration_no_number_is_stated_as_now(clock: FakeClock) -> None:
    """A timed_iter over a loader of loaders: its configuration is unknown, so the advice says what to use
    and never what is set now."""
    sw = cpu_loop(clock, 20, 10 * MS, {"forward": MS, "backward": MS})
    advice = analyze(on_cores(sw.summary(), 2, gpu=True)).advice
    assert advice[0].startswith("use DataLoader(num_workers=1), the most this 2-core machine can spare")
    assert not any("(now" in line for line in advice)


def test_moderately_input_bound(clock: FakeClock) -> None:
    sw = cpu_loop(clock, 20, MS, {"forward": 5 * MS, "backward": 4 * MS})
    verdict = sw.summary().verdict
    assert (verdict.kind, verdict.degree) == ("input-bound", "moderately")


def test_compute_bound_on_cpu(clock: FakeClock) -> None:
    sw = cpu_loop(clock, 20, MS // 10, {"forward": 4 * MS, "backward": 5 * MS, "optimizer": MS})
    verdict = sw.summary().verdict
    assert verdict.kind == "compute-bound" and verdict.degree is None
    assert verdict.figures["compute_share"] > 0.95
    assert not any("num_workers" in advice for advice in verdict.advice)  # nothing points at the data


def test_balanced_names_the_largest_part(clock: FakeClock) -> None:
    sw = cpu_loop(clock, 20, MS // 10, {"forward": 2 * MS, "logging": 6 * MS})
    verdict = sw.summary().verdict
    assert verdict.kind == "balanced"
    assert "step/logging" in verdict.headline


def test_first_epoch_batches_and_validation_do_not_move_the_verdict(clock: FakeClock) -> None:
    sw = Stopwatch(clock=clock)
    sw.enable()

    def data(first_wait: int):
        for i in range(10):
            clock.advance(first_wait if i == 0 else MS // 10)
            yield i

    for _ in sw.timed_iter(data(first_wait=2_000 * MS)):  # a 2 s start-up, then fast batches
        with sw.timed("forward"):
            clock.advance(10 * MS)
    for _ in sw.timed_iter(data(first_wait=MS), phase="val"):  # a slow validation loader
        clock.advance(MS)
    assert sw.summary().verdict.kind == "compute-bound"


def device_loop(clock: FakeClock, *, wait: int, launch: int, cpu: int, steps: int = 30) -> Summary:
    device = FakeDevice(clock)
    sw = Stopwatch(clock=clock, device=device, warmup=1)
    sw.enable()
    for _ in sw.timed_iter(slow_data(clock, steps, wait)):
        with sw.timed("forward"):
            device.launch(launch)
            clock.advance(cpu)
    return sw.summary()


def test_gpu_verdicts(clock: FakeClock) -> None:
    starved = device_loop(clock, wait=10 * MS, launch=MS, cpu=MS // 10).verdict
    assert (starved.kind, starved.degree) == ("input-bound", "highly")
    assert "GPU sat idle" in starved.headline
    bound = device_loop(clock, wait=MS // 10, launch=20 * MS, cpu=MS // 10).verdict
    assert bound.kind == "compute-bound" and "GPU was busy" in bound.headline
    host = device_loop(clock, wait=MS // 100, launch=MS // 10, cpu=5 * MS).verdict
    assert host.kind == "host-bound"
    assert host.figures["caught_up_share"] == 1.0
    assert any("torch.compile" in advice for advice in host.advice)


def test_copy_advice(clock: FakeClock) -> None:
    sw = cpu_loop(clock, 20, 10 * MS, {"h2d": MS, "forward": MS})
    assert any("pin_memory=True" in advice for advice in sw.summary().verdict.advice)


class SlowSamples(Dataset[int]):
    """4 ms of busy work per sample: a controlled pipeline for the worker estimate."""

    def __len__(self) -> int:
        return 48

    def __getitem__(self, index: int) -> int:
        spin(0.005)
        return index


def test_worker_estimate_on_a_controlled_pipeline() -> None:
    sw = Stopwatch(warmup=1)
    sw.enable()
    loader = DataLoader(SlowSamples(), batch_size=4, num_workers=1, multiprocessing_context="fork")
    for _ in sw.watch(loader):
        time.sleep(0.009)  # the step (sleeping, so the worker and its queue threads have the other core)
    summary = on_cores(sw.summary(), 16, gpu=True)
    verdict = analyze(summary)
    assert verdict.kind == "input-bound"
    # The truths are lower bounds (a preempted busy-wait runs long): a batch costs a worker at least 20 ms.
    busy = verdict.figures["worker_busy_per_batch_s"]
    assert busy >= 4 * 0.005
    needed = math.ceil(busy / summary.stages["step"].mean)  # what was measured, not the nominal 20/9
    assert verdict.figures["workers_needed"] == needed >= 2
    assert any(f"use DataLoader(num_workers={needed}) (now 1)" in advice for advice in verdict.advice), verdict.advice
    assert any("loader/dataset" in advice for advice in verdict.advice)


def slow_start(worker_id: int) -> None:
    time.sleep(0.3)  # workers that take a while to start: opening files, building indexes


def slowly_starting_epochs() -> Stopwatch:
    """Two epochs over 2 workers that take 0.3 s to start, each time (not persistent). 16 batches an epoch: a
    worker that a busy machine starts later than the other makes one later batch wait too, which 4 batches an
    epoch left as the mean wait of the others (a full-suite run failed so)."""
    sw = Stopwatch()
    sw.enable()
    loader = DataLoader(range(64), batch_size=4, num_workers=2, worker_init_fn=slow_start)
    for _ in range(2):
        for _ in sw.watch(loader):
            spin(0.01)
    return sw


def test_persistent_workers_advice_when_each_epoch_starts_slowly() -> None:
    sw = slowly_starting_epochs()
    verdict = sw.summary().verdict
    # each worker sleeps 0.3 s from its start; the first batch's wait opens once iter() has started them (the
    # forks' milliseconds before it), so it measures a little less than the sleep (298 ms seen)
    assert sw.summary().stages["first_batch"].mean > 0.25
    assert any("persistent_workers=True" in advice for advice in verdict.advice), verdict.advice
    steady = Stopwatch()
    steady.enable()
    persistent = DataLoader(range(16), batch_size=4, num_workers=2, persistent_workers=True)
    for _ in range(4):  # the workers start once: later epochs' first batches are as quick as the others
        for _ in steady.watch(persistent):
            spin(0.01)
    assert not any("persistent_workers" in advice for advice in steady.summary().verdict.advice)


def test_verdict_is_in_the_report_and_the_saved_file(clock: FakeClock, tmp_path: Path) -> None:
    sw = cpu_loop(clock, 10, 10 * MS, {"forward": MS})
    assert "verdict: highly input-bound" in sw.report()
    sw.save(tmp_path / "run.json")
    saved = json.loads((tmp_path / "run.json").read_text())["verdict"]
    assert saved["kind"] == "input-bound" and saved["degree"] == "highly"
    assert saved["thresholds"]["highly"] == 0.2
    assert stepwatch.load(tmp_path / "run.json").verdict.label == "highly input-bound"


# -- compare --------------------------------------------------------------------------------------------


def two_runs(clock: FakeClock, tmp_path: Path) -> tuple[Path, Path]:
    before = cpu_loop(clock, 10, MS, {"forward": 10 * MS, "old": MS})
    after = cpu_loop(clock, 10, MS, {"forward": 12 * MS, "h2d": MS})
    paths = tmp_path / "before.json", tmp_path / "after.json"
    before.save(paths[0])
    after.save(paths[1])
    return paths


def test_compare_known_differences(clock: FakeClock, tmp_path: Path) -> None:
    before, after = two_runs(clock, tmp_path)
    comparison = compare(stepwatch.load(before), stepwatch.load(after))
    changes = {change.path: change for change in comparison.stages}
    assert changes["step/forward"].percent == pytest.approx(20.0)
    assert changes["step/forward"].delta == pytest.approx(2e-3)
    assert changes["step/old"].after is None and changes["step/h2d"].before is None
    assert comparison.step.percent == pytest.approx((14 - 12) / 12 * 100)
    samples_before, samples_after = comparison.throughput["samples"]
    assert samples_after / samples_before == pytest.approx(12 / 14)


def test_compare_cli_and_exit_codes(clock: FakeClock, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before, after = (str(p) for p in two_runs(clock, tmp_path))
    assert main(["compare", before, after]) == 0
    out = capsys.readouterr().out
    assert "+20.0%" in out and "only before" in out and "only after" in out and "samples/s" in out
    assert main(["compare", before, after, "--fail-if-slower", "10"]) == 1  # the step got 16.7% slower
    assert "time per step +16.7%" in capsys.readouterr().err
    assert main(["compare", before, after, "--fail-if-slower", "17"]) == 0
    assert main(["compare", before, after, "--fail-if-slower", "17", "--stage", "forward"]) == 1
    assert "step/forward +20.0%" in capsys.readouterr().err
    assert main(["compare", before, after, "--fail-if-slower", "25", "--stage", "step/forward"]) == 0
    assert main(["compare", before, after, "--fail-if-slower", "5", "--stage", "nope"]) == 2
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert main(["compare", before, str(bad)]) == 2
    err = capsys.readouterr().err
    assert (
        err.strip()
        .splitlines()[-1]
        .endswith("truncated JSON (Expecting property name enclosed in double quotes at line 1, column 2)")
    )


def test_compare_gate_as_a_real_subprocess(clock: FakeClock, tmp_path: Path) -> None:
    before, after = (str(p) for p in two_runs(clock, tmp_path))
    result = subprocess.run(
        [PYTHON, "-m", "stepwatch", "compare", before, after, "--fail-if-slower", "10"],
        env=subprocess_env(),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1 and "slower by more than 10%" in result.stderr


def test_demo_runs_and_prints_verdicts(tmp_path: Path) -> None:
    result = subprocess.run(
        [PYTHON, "-m", "stepwatch", "demo", "--samples", "240", "--epochs", "1", "--out-dir", str(tmp_path)],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("verdict: ") >= 2
    assert "input-bound" in result.stdout
    assert "stepwatch compare:" in result.stdout
    first = stepwatch.load(tmp_path / "demo-0-workers.json")
    second = stepwatch.load(tmp_path / "demo-2-workers.json")
    assert first.verdict.kind == "input-bound"
    assert first.stages["loader/dataset/augment"].calls > 0
    assert sum(w.batches for w in second.main_phase.workers.values()) > 0
    for name in ("demo-0-workers.html", "demo-2-workers.html", "demo-compare.png"):  # the pictures, announced
        assert (tmp_path / name).stat().st_size > 20_000 and str(tmp_path / name) in result.stdout
    assert "<svg" in (tmp_path / "demo-2-workers.html").read_text()


# -- advice from the loader's configuration; verdicts that do not hinge on names ---------------------------------


def test_the_loader_configuration_is_recorded() -> None:
    sw = Stopwatch()
    sw.enable()
    loader = DataLoader(range(8), batch_size=4, num_workers=1, persistent_workers=True, prefetch_factor=3)
    for _ in sw.watch(loader):
        pass
    config = sw.summary().metadata["loaders"]["train"]
    assert config["num_workers"] == 1 and config["batch_size"] == 4 and config["prefetch_factor"] == 3
    assert config["persistent_workers"] is True and config["pin_memory"] is False
    assert config["dataset"] == "map" and config["start_method"] and config["cpu_count"]
    assert isinstance(config["torch_threads"], int)


def test_the_machine_s_cores_are_read_once_a_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """``os.cpu_count()`` reads a file of /sys (58 us cold): each loop's start asked for it; now the first does, and
    the run's metadata and the tuning's plan take the same reading."""
    from stepwatch._dataloader import find
    from stepwatch._tune_plan import plan
    from stepwatch._tuning import Setting

    reads = []
    monkeypatch.setattr(find, "_cores", None)
    monkeypatch.setattr(find.os, "cpu_count", lambda: reads.append(1) or 7)
    sw = Stopwatch()
    sw.enable()
    loader = DataLoader(range(8), batch_size=4)
    for _ in range(3):  # three epochs, each a loop's start
        for _ in sw.watch(loader):
            pass
    metadata = sw.summary().metadata
    assert metadata["cpu_count"] == metadata["loaders"]["train"]["cpu_count"] == 7
    next(plan(Setting(0), map_style=True))
    assert len(reads) == 1


def test_a_loop_s_start_runs_no_import_statement_of_stepwatch(monkeypatch: pytest.MonkeyPatch) -> None:
    """An import statement of a module already imported still runs the import machinery: about 15 us of cold code
    at a loop's start each (the model's work has left it cold). After a process's first loop, a loop's start (the
    stopwatch switched on again, watch(), the first batch and step) runs none of stepwatch's."""
    import builtins

    loader = DataLoader(list(range(16)), batch_size=4)

    def one_run() -> None:
        stepwatch.enable()
        try:
            for _ in stepwatch.watch(loader):
                with stepwatch.timed("forward"):
                    pass
        finally:
            stepwatch.disable()

    one_run()  # the process's first loop: what is imported once a process is
    seen: list[str] = []
    real_import = builtins.__import__

    def counting_import(name: str, globals: dict | None = None, *args: object, **kwargs: object) -> object:
        if (globals or {}).get("__name__", "").startswith("stepwatch"):
            seen.append(f"{globals['__name__']}: {name}")  # type: ignore[index]
        return real_import(name, globals, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", counting_import)
    one_run()
    monkeypatch.setattr(builtins, "__import__", real_import)
    stages = stepwatch.summary().phases["train"].stages
    stepwatch.reset()
    assert seen == []
    assert stages["first_batch/dataset"].calls + stages["loader/dataset"].calls == 16 * 2  # both runs' reads timed


def test_the_configuration_is_read_through_wrappers_and_loaders_of_loaders() -> None:
    """Accelerate's DataLoaderShard (which forwards every attribute to its base_dataloader) and Lightning's
    CombinedLoader holding one DataLoader give that DataLoader's configuration; several loaders give none."""
    from accelerate.data_loader import DataLoaderShard
    from lightning.pytorch.utilities import CombinedLoader

    from stepwatch._dataloader.find import inner_loader, loader_config

    shard = DataLoaderShard(range(16), batch_size=4, num_workers=1, persistent_workers=True)
    assert inner_loader(shard) is shard.base_dataloader
    assert loader_config(shard)["num_workers"] == 1 and loader_config(shard)["persistent_workers"] is True
    one = DataLoader(range(16), batch_size=4, num_workers=1)
    assert loader_config(CombinedLoader({"a": one}))["batch_size"] == 4
    two = CombinedLoader([one, DataLoader(range(8), batch_size=2)])
    assert inner_loader(two) is None and loader_config(two) is None
    assert loader_config(range(3)) is None


def test_never_advise_fewer_workers_than_configured(clock: FakeClock) -> None:
    sw = cpu_loop(clock, 20, 10 * MS, {"forward": MS, "backward": MS})
    many_cores = analyze(with_loader(on_cores(sw.summary(), 16, gpu=True), num_workers=2))
    assert many_cores.figures["workers_needed"] == 12  # 2 workers give a batch per 12 ms; the step takes 2
    assert "use DataLoader(num_workers=12) (now 2)" in many_cores.advice[0]
    few_cores = analyze(with_loader(on_cores(sw.summary(), 2, gpu=True), num_workers=2))
    assert "no core to spare beyond the 2 it runs: make the pipeline cheaper" in few_cores.advice[0]
    assert not any("num_workers=1" in advice for advice in few_cores.advice)


def test_never_advise_what_is_already_set() -> None:
    summary = slowly_starting_epochs().summary()
    assert any("persistent_workers=True" in advice for advice in summary.verdict.advice)
    assert not any("persistent_workers" in a for a in analyze(with_loader(summary, persistent_workers=True)).advice)


@pytest.mark.parametrize("stages", [{"training_step": 50 * MS}, {}], ids=["one block", "no blocks"])
def test_the_verdict_does_not_hinge_on_stage_names(clock: FakeClock, stages: dict[str, int]) -> None:
    sw = Stopwatch(clock=clock)
    sw.enable()
    for _ in sw.timed_iter(slow_data(clock, 10, MS // 2)):
        for name, ns in stages.items():
            with sw.timed(name):
                clock.advance(ns)
        clock.advance(0 if stages else 50 * MS)
    verdict = sw.summary().verdict
    assert verdict.kind == "compute-bound", verdict.headline
    assert verdict.figures["compute_share"] == pytest.approx(50 / 50.5)


def test_named_other_work_is_taken_out_of_the_computation(clock: FakeClock) -> None:
    sw = cpu_loop(clock, 20, MS // 10, {"forward": 2 * MS, "h2d": 3 * MS, "logging": 6 * MS})
    verdict = sw.summary().verdict
    assert verdict.kind == "balanced" and "step/logging" in verdict.headline
    assert verdict.figures["compute_share"] == pytest.approx(2 / 11.1, abs=1e-3)

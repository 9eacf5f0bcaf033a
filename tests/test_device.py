"""Device timing through the test double: events, lazy resolution, idle gaps, memory, OOM, sync, NVTX."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import stepwatch
from stepwatch import Stopwatch

from .conftest import FakeClock
from .fake_device import FakeDevice, FakeOutOfMemoryError

MS = 1_000_000  # ns


def make(clock: FakeClock, **kwargs: object) -> tuple[Stopwatch, FakeDevice]:
    device = FakeDevice(clock)
    sw = Stopwatch(clock=clock, device=device, **kwargs)  # type: ignore[arg-type]
    sw.enable()
    return sw, device


def train(sw: Stopwatch, device: FakeDevice, clock: FakeClock, steps: int, *, load_ns: int, fwd: int, bwd: int) -> None:
    """A loop whose loader costs ``load_ns`` of CPU time and whose stages launch device work."""

    def batches():
        for i in range(steps):
            clock.advance(load_ns)
            yield i

    for _ in sw.timed_iter(batches()):
        with sw.timed("forward"):
            device.launch(fwd)
            clock.advance(MS // 10)  # launching costs the CPU 0.1 ms
        with sw.timed("backward"):
            device.launch(bwd)
            clock.advance(MS // 5)
        sw.count(samples=32)


def test_gpu_bound_loop_device_times_without_synchronize(clock: FakeClock) -> None:
    sw, device = make(clock)
    train(sw, device, clock, 50, load_ns=MS // 2, fwd=6 * MS, bwd=10 * MS)
    assert device.calls["synchronize"] == 1  # once when timing starts (the clock anchor), never per stage
    summary = sw.summary()
    assert device.calls["synchronize"] == 2  # pending events resolved once, for the summary
    stages = summary.stages
    assert stages["step/forward"].device.mean == pytest.approx(6e-3)
    assert stages["step/backward"].device.mean == pytest.approx(10e-3)
    assert stages["step/forward"].mean == pytest.approx(0.1e-3)  # the CPU only launched the work
    assert stages["step/forward"].device.calls == 49  # the epoch's first step is reported apart
    children = stages["step/forward"].device.total + stages["step/backward"].device.total
    assert children == pytest.approx(stages["step"].device.total, rel=0.05)
    assert summary.main_phase.device.idle_share == pytest.approx(0.0, abs=0.01)
    assert summary.main_phase.device_throughput["samples"] == pytest.approx(32 / 16e-3, rel=0.01)


def test_input_starved_loop_shows_high_idle_share(clock: FakeClock) -> None:
    sw, device = make(clock)
    train(sw, device, clock, 50, load_ns=10 * MS, fwd=MS // 2, bwd=MS // 2)
    load = sw.summary().main_phase.device
    assert load.steps == 49
    # each step keeps the device busy ~1 ms, then it waits ~10 ms for the next batch
    assert load.idle_share == pytest.approx(10 / 11, abs=0.02)
    assert sw.summary().share("loader") == pytest.approx(10 / 10.3, abs=0.02)


def test_events_are_pooled_and_reused(clock: FakeClock) -> None:
    sw, device = make(clock)
    train(sw, device, clock, 500, load_ns=MS, fwd=MS // 10, bwd=MS // 10)
    sw.summary()
    # start and end of step, forward and backward; an anchor event when timing starts and after the drain
    assert device.calls["record"] == 500 * 6 + 2
    assert device.events_created <= 12  # the same few events go round


def test_resolution_is_lazy_and_in_order(clock: FakeClock) -> None:
    sw, device = make(clock)
    train(sw, device, clock, 5, load_ns=0, fwd=100 * MS, bwd=100 * MS)
    # the device is far behind: nothing could be resolved yet, and nothing was forced
    assert device.calls["elapsed"] == 0 and device.calls["synchronize"] == 1  # the anchor, when timing starts
    assert device.calls["query"] <= 5  # per step: one failed poll; the step's end is never raced for
    assert sw.summary().stages["step/forward"].device.calls == 4


def test_bounded_queue_drains_with_one_synchronize_when_full(clock: FakeClock) -> None:
    sw, device = make(clock)
    assert sw.device_timer is not None
    sw.device_timer.max_pending = 9  # 3 measurements per step: full every 3 steps
    train(sw, device, clock, 12, load_ns=0, fwd=100 * MS, bwd=100 * MS)
    assert device.calls["synchronize"] == 1 + 4  # the anchor when timing starts, then one per full queue
    assert sw.summary().stages["step/backward"].device.calls == 11


def test_nested_peak_memory(clock: FakeClock) -> None:
    sw, device = make(clock, memory="stage")
    device.allocate(100)
    with sw.timed("outer"):
        device.allocate(50)
        with sw.timed("big"):
            device.allocate(1000)
            device.free(1000)
        with sw.timed("small"):
            device.allocate(10)
            device.free(10)
        device.free(50)
    stages = sw.summary().stages
    assert stages["outer/big"].peak_allocated == 1150
    assert stages["outer/small"].peak_allocated == 160  # the big sibling's peak does not leak into it
    assert stages["outer"].peak_allocated == 1150  # a parent's peak is at least each child's


@pytest.mark.parametrize("memory", ["step", "stage"])
def test_known_tensor_shows_in_its_peak(clock: FakeClock, memory: str) -> None:
    sw, device = make(clock, memory=memory)
    for _ in sw.timed_iter(range(5)):
        with sw.timed("forward"):
            device.allocate(64 * 2**20)
            device.free(64 * 2**20)
        with sw.timed("backward"):
            pass
    stages = sw.summary().stages
    assert stages["step"].peak_allocated >= 64 * 2**20  # the step's peak covers its blocks either way
    assert "peak MiB" in sw.report() and "64.0" in sw.report()
    reads = device.calls["memory_peaks"]
    if memory == "step":  # one read of the statistics per step, none per block
        assert stages["step/forward"].peak_allocated is None
        assert reads == 5
    else:
        assert stages["step/forward"].peak_allocated >= 64 * 2**20
        assert stages["step/backward"].peak_allocated < 64 * 2**20  # the sibling's peak does not leak
        assert reads == 5 * (1 + 2 * 2)  # each block: the parent's peak before it, its own after


def test_memory_mode_is_checked() -> None:
    with pytest.raises(ValueError, match="memory must be"):
        Stopwatch(memory="all")


def test_out_of_memory_is_recorded_then_propagates(clock: FakeClock) -> None:
    sw, device = make(clock)
    error = FakeOutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore details")
    with pytest.raises(FakeOutOfMemoryError) as raised:
        for _ in sw.timed_iter(range(3)):
            with sw.timed("forward"):
                device.allocate(3000)
                raise error
    assert raised.value is error
    (event,) = sw.summary().out_of_memory
    assert (event.phase, event.stage, event.allocated) == ("train", "first_step/forward", 3000)
    assert event.message == "CUDA out of memory. Tried to allocate 2.00 GiB"
    assert "out of memory in train:first_step/forward" in sw.report()


def test_sync_mode_synchronizes_at_boundaries_and_says_so(clock: FakeClock) -> None:
    sw, device = make(clock, sync=True)
    train(sw, device, clock, 10, load_ns=MS, fwd=6 * MS, bwd=10 * MS)
    assert device.calls["synchronize"] >= 10 * 4
    stages = sw.summary().stages
    assert stages["step/forward"].mean == pytest.approx(6e-3, rel=0.05)  # wall time now includes the work
    assert stages["step/backward"].mean == pytest.approx(10e-3, rel=0.05)
    assert "sync mode on" in sw.report()
    assert sw.summary().metadata["config"]["sync"] is True


def test_nvtx_ranges_name_the_stages(clock: FakeClock) -> None:
    sw, device = make(clock, nvtx=True)
    train(sw, device, clock, 2, load_ns=0, fwd=MS, bwd=MS)
    assert device.range_log[:4] == [("push", "step"), ("push", "forward"), ("pop", "forward"), ("push", "backward")]
    assert device.ranges == []  # balanced


def test_sync_and_nvtx_need_a_device() -> None:
    with pytest.raises(ValueError, match="need a device"):
        Stopwatch(sync=True)


def test_report_has_device_columns_and_idle_share(clock: FakeClock) -> None:
    sw, device = make(clock)
    train(sw, device, clock, 5, load_ns=10 * MS, fwd=MS, bwd=MS)
    text = sw.report()
    assert "dev ms/call" in text and "peak MiB" in text
    assert "idle" in text and "between steps" in text
    assert "fake:0 Test Accelerator" in text
    cpu_only = Stopwatch(clock=clock)
    cpu_only.enable()
    with cpu_only.timed("x"):
        pass
    assert "dev ms/call" not in cpu_only.report()
    assert math.isnan(cpu_only.summary().main_phase.device.idle_share)


def test_device_figures_survive_save_load_and_resume(clock: FakeClock, tmp_path: Path) -> None:
    import torch

    sw, device = make(clock)
    train(sw, device, clock, 4, load_ns=MS, fwd=2 * MS, bwd=3 * MS)
    sw.save(tmp_path / "run.json")
    loaded = stepwatch.load(tmp_path / "run.json")
    assert loaded.stages["step/forward"].device == sw.summary().stages["step/forward"].device
    assert loaded.main_phase.device == sw.summary().main_phase.device

    torch.save(sw.state_dict(), tmp_path / "c.pt")
    resumed, device2 = make(clock)
    resumed.load_state_dict(torch.load(tmp_path / "c.pt", weights_only=True))
    train(resumed, device2, clock, 4, load_ns=MS, fwd=2 * MS, bwd=3 * MS)
    summary = resumed.summary()
    assert summary.stages["step/forward"].device.calls == 6  # 3 + 3: each epoch's first step apart
    assert summary.main_phase.device.steps == 6
    assert summary.metadata["devices"] == ["fake:0 Test Accelerator"]


def test_cuda_requested_without_cuda_is_a_clear_error() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    sw = Stopwatch(device="cuda")  # constructing opens nothing
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        sw.enable()
    assert not sw.is_enabled()


def test_a_failing_device_does_not_cost_the_cpu_figures(clock: FakeClock, tmp_path: Path) -> None:
    sw, device = make(clock)
    train(sw, device, clock, 5, load_ns=0, fwd=100 * MS, bwd=100 * MS)  # events still pending

    def broken() -> None:
        raise RuntimeError("CUDA error: \x1b[2Jdevice-side assert triggered\nmore")  # an escape, a 2nd line

    device.synchronize = broken  # type: ignore[method-assign]
    sw.save(tmp_path / "run.json")
    loaded = stepwatch.load(tmp_path / "run.json")
    assert loaded.stages["step/forward"].calls == 4  # wall times kept
    assert loaded.stages["step/forward"].device is None  # device times were pending: dropped
    assert "device failed" in stepwatch.render(loaded) and "device-side assert" in stepwatch.render(loaded)
    assert loaded.metadata["device_error"] == "RuntimeError: CUDA error: ?[2Jdevice-side assert triggered"


# -- host-bound detection on a stream that runs in real time -------------------------------------------------


def batches(count: int, wait_s: float) -> Iterator[int]:
    for index in range(count):
        if wait_s:
            time.sleep(wait_s)
        yield index


def realtime_loop(
    python_s: float, kernel_s: float, steps: int = 25, item: bool = False, wait_s: float = 0.0
) -> stepwatch.Summary:
    """A loop on the real-time stream; ``item``: the user's ``loss.item()`` at each step's end, which waits for
    the stream (and so empties its queue there); ``wait_s``: the wait for each batch, the device's idle time
    between steps."""
    from .realtime_device import RealtimeDevice

    device = RealtimeDevice()
    try:
        sw = Stopwatch(device=device)  # type: ignore[arg-type]
        sw.enable()
        for _ in sw.timed_iter(batches(steps, wait_s)):
            with sw.timed("forward"):
                device.launch(kernel_s)
                time.sleep(python_s)  # Python between kernels (sleep: the stream thread keeps running)
                device.launch(kernel_s)
            with sw.timed("backward"):
                device.launch(kernel_s)
            if item:
                device.synchronize()
        return sw.summary()
    finally:
        device.close()


def test_a_loop_that_synchronizes_every_step_with_a_busy_device_is_compute_bound() -> None:
    """75 ms of device work a step and ``loss.item()`` at its end: the queue is empty at every step's end by
    construction, yet the device was busy, behind the host, at the stages before: compute-bound. The wait for
    each batch (1.5 ms, 2% of the step) leaves 2 ms of slack below the 5% "moderately input-bound" line for the
    stream thread's late wake-ups (with 22 ms a step and 0.7 ms waits a busy CI machine measured 5.7% idle)."""
    summary = realtime_loop(python_s=0.0, kernel_s=0.025, steps=20, item=True, wait_s=0.0015)
    verdict = summary.verdict
    assert verdict.kind == "compute-bound", verdict.headline
    assert 0.01 < verdict.figures["device_idle_share"] < 0.10  # the wait for each batch: a few % idle
    assert verdict.figures["caught_up_share"] < 0.5
    assert "GPU was busy" in verdict.headline


def test_a_loop_of_python_between_tiny_kernels_is_host_bound_on_a_realtime_stream() -> None:
    """30 ms of Python between 0.1 ms kernels: a step is caught up when the stream ran its boundaries within a
    tenth of the step (3 ms), wide enough for a busy machine's late wake-ups of the stream's thread (with 10 ms of
    Python, 1 ms of slack, a busy CI machine missed it in 7 of 24 steps)."""
    summary = realtime_loop(python_s=0.030, kernel_s=0.0001, steps=20)
    verdict = summary.verdict
    assert verdict.kind == "host-bound", verdict.headline  # not "compute-bound: the GPU was busy 98%"
    assert verdict.figures["caught_up_share"] > 0.8


def test_a_loop_of_long_kernels_is_compute_bound_on_a_realtime_stream() -> None:
    summary = realtime_loop(python_s=0.0, kernel_s=0.010)
    verdict = summary.verdict
    assert verdict.kind == "compute-bound", verdict.headline
    assert verdict.figures["caught_up_share"] < 0.2


def test_use_device_times_on_the_device_from_then_on_and_keeps_a_device_once_given(clock: FakeClock) -> None:
    sw = Stopwatch(clock=clock)
    sw.enable()
    with sw.timed("forward"):  # before: a CPU block
        clock.advance(MS)
    device = FakeDevice(clock)
    sw.use_device(device)
    train(sw, device, clock, 10, load_ns=MS // 2, fwd=6 * MS, bwd=10 * MS)
    stages = sw.summary().stages
    assert stages["forward"].device is None  # recorded before the device was given
    assert stages["step/forward"].device.mean == pytest.approx(6e-3)
    assert sw.summary().metadata["config"]["device"] == FakeDevice.name
    other = FakeDevice(clock)
    sw.use_device(other)  # a device once given stays
    train(sw, device, clock, 3, load_ns=MS // 2, fwd=6 * MS, bwd=10 * MS)
    assert other.calls.total() == 0

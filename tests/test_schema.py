"""Bad input gets one clear error and loses nothing: crafted and fuzzed saved files, corrupt state_dicts.

The fuzzer takes real saved runs (a CPU loop with a validation phase, a loop on the device test double with an
out-of-memory record, a loop over real DataLoader workers) and changes one field at a time to a hostile value.
Every mutation must either load and then render, export, compare and save again, or raise FormatError.
"""

from __future__ import annotations

import copy
import json
import math
import zlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

import stepwatch
from stepwatch import FormatError, Stopwatch
from stepwatch._analysis import compare
from stepwatch._render import FORMATS, render_comparison
from stepwatch._render.html import render_html
from stepwatch._run_file import parse_summary, summary_to_json

from .conftest import FakeClock
from .fake_device import FakeDevice, FakeOutOfMemoryError

MS = 1_000_000


def cpu_run() -> dict[str, Any]:
    clock = FakeClock()
    sw = Stopwatch(clock=clock, warmup=1, window=8)
    sw.enable()
    for i in sw.timed_iter(range(12)):
        clock.advance(3 * MS)
        with sw.timed("forward"):
            clock.advance(MS + i)
        sw.count(samples=4, tokens=1.5)
    for _ in sw.timed_iter(range(3), phase="val"):
        clock.advance(7)
    return json.loads(summary_to_json(sw.summary()))


def device_run() -> dict[str, Any]:
    clock = FakeClock()
    device = FakeDevice(clock)
    sw = Stopwatch(clock=clock, device=device)  # type: ignore[arg-type]
    sw.enable()
    for i in sw.timed_iter(range(6)):
        with sw.timed("forward"):
            device.launch(2 * MS)
            device.allocate(1000)
            clock.advance(MS)
        if i == 5:
            try:
                with sw.timed("backward"):
                    raise FakeOutOfMemoryError("out of memory")
            except FakeOutOfMemoryError:
                pass
    return json.loads(summary_to_json(sw.summary()))


def worker_run() -> dict[str, Any]:
    sw = Stopwatch()
    sw.enable()
    loader = DataLoader(list(range(8)), batch_size=2, num_workers=1, multiprocessing_context="fork")
    for _ in sw.watch(loader):
        pass
    return json.loads(summary_to_json(sw.summary()))


def traced_run() -> dict[str, Any]:
    """A run that kept its timeline, DataLoader worker's events included."""
    sw = Stopwatch(trace_steps=3)
    sw.enable()
    loader = DataLoader(list(range(8)), batch_size=2, num_workers=1, multiprocessing_context="fork")
    for _ in sw.watch(loader):
        with sw.timed("forward"):
            pass
    document = json.loads(summary_to_json(sw.summary()))
    assert document["trace"]
    return document


def flops_run() -> dict[str, Any]:
    """A run with FLOPs counted on one step and a peak given: metadata.flops and metadata.peak_flops."""
    import torch

    sw = Stopwatch(flops=True, peak_flops=1e12)
    sw.enable()
    model = torch.nn.Linear(4, 2)
    for (x,) in sw.timed_iter(DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4)), batch_size=2)):
        with sw.timed("forward"):
            loss = model(x).sum()
        with sw.timed("backward"):
            loss.backward()
    document = json.loads(summary_to_json(sw.summary()))
    assert document["metadata"]["flops"]["train"]["step"] > 0
    return document


def compiled_run() -> dict[str, Any]:
    """A model under torch.compile that recompiles at its short last batch (metadata.compiles, the compile row;
    FLOPs asked for and not counted under it: metadata.flops_note) and two gather windows (metadata.windows)."""
    import torch

    torch._dynamo.reset()
    sw = Stopwatch(flops=True)
    sw.enable()
    compiled = torch.compile(torch.nn.Linear(4, 2), backend="eager")
    data = torch.utils.data.TensorDataset(torch.randn(9, 4))
    for index, (x,) in enumerate(sw.timed_iter(DataLoader(data, batch_size=2))):
        with sw.timed("forward"):
            loss = compiled(x).sum()
        with sw.timed("backward"):
            loss.backward()
        if index in (3, 4):
            sw.windows.note(sw.summary())
    document = json.loads(summary_to_json(sw.summary()))
    metadata = document["metadata"]
    assert metadata["flops_note"].startswith("not counted: the model runs under torch.compile")
    assert len(metadata["windows"]) == 2 and any(event[3] for event in metadata["compiles"])
    return document


def auto_run() -> dict[str, Any]:
    """A loop recorded by auto-instrumentation: its metadata says what was found."""
    import torch

    stepwatch.auto()
    try:
        model = torch.nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for (x,) in DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 2)), batch_size=2):
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()
        document = json.loads(summary_to_json(stepwatch.summary()))
        assert document["metadata"]["auto"].startswith("auto: DataLoader")
        return document
    finally:
        stepwatch.auto(False)
        stepwatch.disable()
        stepwatch.reset()


RUNS = {
    "cpu": cpu_run(),
    "device": device_run(),
    "workers": worker_run(),
    "auto": auto_run(),
    "flops": flops_run(),
    "compiled": compiled_run(),
    "traced": traced_run(),
}

CPU_SUMMARY = parse_summary(json.dumps(RUNS["cpu"]).encode())


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every field of a JSON document, as key paths."""
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, child in value.items():
            found += paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value[:3]):
            found += paths(child, (*prefix, index))
    return found


def assert_usable(raw: bytes, where: str) -> None:
    """Loads, or says why not in one FormatError; what loads renders, compares and saves again."""
    try:
        summary = parse_summary(raw, where)
    except FormatError as error:
        assert where in str(error) and "\n" not in str(error)
        return
    rendered = {format.name: format.render(summary) for format in FORMATS.values() if format.name != "html"}
    assert all(isinstance(text, str) for text in rendered.values())
    # the page's tables for every document; its plots (half a second each on a slow machine) for one in 400:
    # still about a hundred of the 37,000 mutated documents plotted
    page = render_html(summary, where, plots=zlib.crc32(where.encode()) % 400 == 0)
    assert page.endswith("</body></html>\n") and page.count("<table") >= len(summary.phases)
    render_comparison(compare(summary, summary))
    render_comparison(compare(summary, CPU_SUMMARY))
    again = parse_summary(rendered["json"].encode(), where)  # the json format is what save writes
    assert again.phases.keys() == summary.phases.keys()


HOSTILE = [
    None,
    True,
    -1,
    0,
    10**30,
    10**400,
    -(10**20),
    1e400,
    1e30,
    -1.5,
    "x",
    "",
    "a\nb",
    [],
    [1, "x"],
    {},
    {"x": 1},
    2**63,
]


@pytest.mark.parametrize("run", sorted(RUNS))
def test_every_field_mutated_to_every_hostile_value(run: str) -> None:
    document = copy.deepcopy(RUNS[run])
    for path in paths(document):
        target = document
        for key in path[:-1]:
            target = target[key]
        original = target[path[-1]]
        for value in HOSTILE:  # one field changed at a time, put back after
            target[path[-1]] = value
            raw = json.dumps(document, allow_nan=True, default=str).encode()
            assert_usable(raw, f"{run}:{'.'.join(map(str, path))}={value!r:.20}")
        target[path[-1]] = original
    assert document == RUNS[run]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run=st.sampled_from(sorted(RUNS)), data=st.data(), value=json_values)
def test_random_field_random_value(run: str, data: st.DataObject, value: Any) -> None:
    document = copy.deepcopy(RUNS[run])
    path = data.draw(st.sampled_from(paths(document)))
    target = document
    for key in path[:-1]:
        target = target[key]
    if data.draw(st.booleans()) and isinstance(target, dict):
        del target[path[-1]]  # a missing field
    else:
        target[path[-1]] = value
    assert_usable(json.dumps(document, default=str).encode(), "fuzzed")


CRAFTED = {
    "loop_ns 1e400": ('"loop_ns": ', '"loop_ns": 1e400, "was": '),
    "window 10**30": ('"window": ', f'"window": {10**30}, "was": '),
    "total_ns 10**400": ('"total_ns": ', f'"total_ns": {10**400}, "was": '),
    "cpu_count x": ('"cpu_count": ', '"cpu_count": "x", "was": '),
    "config x": ('"config": {', '"config": "x", "was": {'),
    "devices 5": ('"devices": [', '"devices": 5, "was": ['),
    "NaN": ('"elapsed": ', '"elapsed": NaN, "was": '),
    "Infinity": ('"elapsed": ', '"elapsed": Infinity, "was": '),
    "negative steps": ('"steps": ', '"steps": -3, "was": '),
}


@pytest.mark.parametrize("kind", sorted(CRAFTED))
def test_crafted_files_are_format_errors(tmp_path: Path, kind: str) -> None:
    old, new = CRAFTED[kind]
    text = summary_to_json(parse_summary(json.dumps(RUNS["cpu"]).encode()))
    assert old in text, old
    path = tmp_path / "crafted.json"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(FormatError, match=r"crafted\.json"):
        stepwatch.load(path)


def test_deeply_nested_json_is_a_format_error(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text('{"format": "stepwatch", "schema": 1, "phases": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(FormatError, match=r"deep\.json"):
        stepwatch.load(path)


def test_oom_record_with_wrong_types_is_a_format_error() -> None:
    document = copy.deepcopy(RUNS["device"])
    assert document["out_of_memory"]
    document["out_of_memory"][0]["allocated"] = "lots"
    with pytest.raises(FormatError, match="allocated"):
        parse_summary(json.dumps(document).encode())


# -- state_dicts ---------------------------------------------------------------------------------------------


def recorded(clock: FakeClock) -> Stopwatch:
    sw = Stopwatch(clock=clock)
    sw.enable()
    for _ in sw.timed_iter(range(5)):
        clock.advance(MS)
        with sw.timed("forward"):
            clock.advance(2 * MS)
        sw.count(samples=1)
    return sw


def corrupt(state: dict[str, Any], change: str) -> dict[str, Any]:
    state = copy.deepcopy(state)
    stages = state["summary"]["phases"]["train"]["stages"]
    if change.startswith("started_at="):
        state["started_at"] = {"x": "x", "list": [1], "inf": math.inf, "1e30": 1e30, "nan": math.nan}[
            change.split("=")[1]
        ]
    elif change == "stage not a dict":
        stages["loader"] = 5
    elif change == "window 10**30":
        stages["loader"]["window"] = 10**30
    elif change == "loop_ns inf":
        state["summary"]["phases"]["train"]["loop_ns"] = math.inf
    elif change == "steps inf":
        state["summary"]["phases"]["train"]["steps"] = math.inf
    elif change == "schedule_pos inf":
        state["schedule_pos"]["train"] = math.inf
    elif change == "negative total":
        stages["step"]["total_ns"] = -(10**12)
    elif change == "negative steps":
        state["summary"]["phases"]["train"]["steps"] = -1
    elif change == "negative elapsed":
        state["elapsed_ns"] = -(10**12)
    elif change == "batch_samples not a dict":
        state["batch_samples"] = ["train"]
    elif change == "batch_samples negative":
        state["batch_samples"] = {"train": -1}
    elif change == "batch_samples a float":
        state["batch_samples"] = {"train": 2.5}
    return state


CORRUPTIONS = [
    "started_at=x",
    "started_at=list",
    "started_at=inf",
    "started_at=1e30",
    "started_at=nan",
    "stage not a dict",
    "window 10**30",
    "loop_ns inf",
    "steps inf",
    "schedule_pos inf",
    "negative total",
    "negative steps",
    "negative elapsed",
    "batch_samples not a dict",
    "batch_samples negative",
    "batch_samples a float",
]


@pytest.mark.parametrize("change", CORRUPTIONS)
def test_corrupt_state_dict_is_refused_before_anything_is_replaced(clock: FakeClock, change: str) -> None:
    state = recorded(clock).state_dict()
    sw = recorded(clock)
    before = sw.summary()
    with pytest.raises(FormatError, match="state_dict"):
        sw.load_state_dict(corrupt(state, change))
    after = sw.summary()
    assert after.phases.keys() == before.phases.keys()
    assert {p: s.calls for p, s in after.stages.items()} == {p: s.calls for p, s in before.stages.items()}
    assert sw.state_dict()["summary"]  # still usable: state_dict and report work
    assert "forward" in sw.report()


@pytest.mark.parametrize("field", ["format", "schema", "ranks", "a rank", "world_size", "missing"])
def test_all_ranks_files_with_hostile_fields(tmp_path: Path, field: str) -> None:
    """An all-ranks file (the gather, stepwatch merge) of real runs, one field at a time made hostile: it
    loads, or it is a FormatError of one line."""
    from stepwatch._all_ranks import load_ranks

    document = {
        "format": "stepwatch-ranks",
        "schema": 1,
        "world_size": 3,
        "missing": [2],
        "ranks": [RUNS["cpu"], RUNS["workers"]],
    }
    path = tmp_path / "ranks.json"
    for value in HOSTILE:
        mutated = copy.deepcopy(document)
        if field == "a rank":
            mutated["ranks"][1] = value
        else:
            mutated[field] = value
        path.write_text(json.dumps(mutated))
        try:
            job = load_ranks(path)
        except FormatError as error:
            assert str(path) in str(error) and "\n" not in str(error)
        else:
            assert job.runs and all(isinstance(run, stepwatch.Summary) for run in job.runs)
            assert job.world_size >= len(job.runs) + len(job.missing)
            assert all(type(rank) is int and rank >= 0 for rank in job.missing)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run=st.sampled_from(sorted(RUNS)), data=st.data())
def test_gathered_payloads_corrupted_are_refused_with_one_line(run: str, data: st.DataObject) -> None:
    """What a rank sends rank 0 in a gather (compressed JSON of its summary), with bytes flipped, cut or
    fields made hostile: rank 0 reads a usable summary or refuses it with one line, never crashes."""
    from stepwatch._gather import _decode, _encode

    payload = _encode(parse_summary(json.dumps(RUNS[run]).encode()), windows=False)
    assert _decode(payload).phases.keys() == parse_summary(json.dumps(RUNS[run]).encode()).phases.keys()
    how = data.draw(st.sampled_from(["flip", "cut", "field"]))
    if how == "flip":
        index = data.draw(st.integers(0, len(payload) - 1))
        payload = payload[:index] + bytes([payload[index] ^ data.draw(st.integers(1, 255))]) + payload[index + 1 :]
    elif how == "cut":
        payload = payload[: data.draw(st.integers(0, len(payload) - 1))]
    else:
        document = json.loads(zlib.decompress(payload))
        path = data.draw(st.sampled_from(paths(document)))
        target = document
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = data.draw(st.sampled_from(HOSTILE))
        payload = zlib.compress(json.dumps(document, allow_nan=True, default=str).encode())
    try:
        summary = _decode(payload)
    except ValueError as error:
        assert "\n" not in str(error) and str(error).startswith("sent a summary that cannot be read")
    else:
        assert isinstance(FORMATS["text"].render(summary), str)

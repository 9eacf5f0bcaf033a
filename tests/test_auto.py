"""Auto-instrumentation in this process: what it patches and how it undoes it, the stages it finds, phases it
names, user blocks nesting, and calls keeping their behaviour. The unchanged programs are in test_run."""

from __future__ import annotations

import inspect
import json
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.optim import optimizer as optim_module
from torch.utils.data import DataLoader, TensorDataset

import stepwatch
from stepwatch import _patches
from stepwatch._batch_size import batch_size, uniform_batches
from stepwatch._patches import moves_to_device

from .conftest import PYTHON, subprocess_env
from .realtime_device import RealtimeDevice

PROGRAMS = Path(__file__).parent / "programs"

PATCHED = [
    (torch.utils.data.DataLoader, "__iter__"),
    (torch.nn.Module, "__call__"),
    (torch.nn.Module, "zero_grad"),
    (torch.autograd, "backward"),
    (torch.optim.Optimizer, "zero_grad"),
]


def train(epochs: int = 1, batches: int = 4, body: Any = None) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(8 * batches, 4), torch.randint(0, 2, (8 * batches,))), batch_size=8)
    for _ in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            if body is not None:
                body(model, x)
    return model


def test_auto_patches_and_auto_false_restores_the_very_originals() -> None:
    before = {(owner, name): vars(owner).get(name) for owner, name in PATCHED}
    signatures = {(owner, name): inspect.signature(getattr(owner, name)) for owner, name in PATCHED}
    hooks = len(optim_module._global_optimizer_pre_hooks)
    stepwatch.auto()
    try:
        for owner, name in PATCHED:
            assert vars(owner).get(name) is not before[(owner, name)], name
            assert inspect.signature(getattr(owner, name)) == signatures[(owner, name)], name
        assert len(optim_module._global_optimizer_pre_hooks) == hooks + 1
        assert stepwatch.is_enabled()
    finally:
        stepwatch.auto(False)
        stepwatch.disable()
    for owner, name in PATCHED:
        assert vars(owner).get(name) is before[(owner, name)], name
    assert "to" not in vars(torch.Tensor) and "cuda" not in vars(torch.Tensor)
    assert not hooks_after_training_left_behind()
    assert len(optim_module._global_optimizer_pre_hooks) == hooks
    assert _patches.session is None


def hooks_after_training_left_behind() -> list[str]:
    """Trains under auto(), then auto(False): what is left on the loader that was watched."""

    def collate(batch: Any) -> Any:
        return torch.utils.data.default_collate(batch)

    loader = DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=4, collate_fn=collate)
    stepwatch.auto()
    try:
        for _ in loader:
            pass
        assert loader.collate_fn is not collate  # watched while auto is on
    finally:
        stepwatch.auto(False)
        stepwatch.disable()
        stepwatch.reset()
    left = [name for name in ("_get_iterator", "__getitems__") if name in vars(loader) or name in vars(loader.dataset)]
    left += ["collate_fn"] if loader.collate_fn is not collate else []
    return left + (["worker_init_fn"] if loader.worker_init_fn is not None else [])


def test_nothing_is_patched_unless_asked() -> None:
    code = (
        "import stepwatch, torch\n"
        "from torch.optim import optimizer\n"
        "stepwatch.enable()\n"
        "assert torch.nn.Module.__call__ is torch.nn.Module._wrapped_call_impl\n"
        "assert not hasattr(torch.utils.data.DataLoader.__iter__, '__wrapped__')\n"
        "assert not optimizer._global_optimizer_pre_hooks\n"
        "assert 'to' not in vars(torch.Tensor)\n"
        "print('clean')\n"
    )
    for env in ({}, {"STEPWATCH": "1"}):
        result = subprocess.run([PYTHON, "-c", code], env=subprocess_env(**env), capture_output=True, text=True)
        assert result.stdout == "clean\n", result.stderr


def test_auto_before_torch_is_imported_patches_when_it_is() -> None:
    code = (
        "import sys, stepwatch\n"
        "stepwatch.auto()\n"
        "assert 'torch' not in sys.modules\n"
        "import torch\n"
        "assert torch.nn.Module.__call__ is not torch.nn.Module._wrapped_call_impl\n"
        "stepwatch.auto(False)\n"
        "assert torch.nn.Module.__call__ is torch.nn.Module._wrapped_call_impl\n"
        "print('ok')\n"
    )
    result = subprocess.run([PYTHON, "-c", code], env=subprocess_env(), capture_output=True, text=True)
    assert result.stdout == "ok\n", result.stderr


def test_stages_once_per_step_and_user_blocks_nest_where_they_run(auto: None) -> None:
    def body(model: nn.Module, x: torch.Tensor) -> None:
        with stepwatch.timed("mine"):
            model(x)  # a forward inside the user's own block: nested under it

    train(epochs=2, batches=4, body=body)
    summary = stepwatch.summary()
    train_phase = summary.phases["train"]
    assert train_phase.steps == 6
    for path in ("step/forward", "step/loss", "step/backward", "step/optimizer", "step/zero_grad", "step/mine"):
        assert train_phase.stages[path].calls == 6, path
    assert train_phase.stages["step/mine/forward"].calls == 6
    assert not any(path.count("forward") > 1 for path in train_phase.stages)  # submodules are not stages
    assert summary.metadata["auto"] == (
        "auto: DataLoader (0 workers), forward: Sequential, loss: CrossEntropyLoss, backward, optimizer: SGD, zero_grad"
    )
    assert stepwatch.report().startswith(summary.metadata["auto"] + "\n")


def test_patched_calls_keep_results_and_exceptions(auto: None) -> None:
    model = nn.Linear(3, 1)
    loader = DataLoader(TensorDataset(torch.randn(12, 3)), batch_size=4)
    for index, (x,) in enumerate(loader):
        assert torch.equal(model(x), torch.nn.functional.linear(x, model.weight, model.bias))
        with pytest.raises(RuntimeError, match="does not require grad"):
            torch.ones(2).sum().backward()
        with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
            model(torch.ones(2, 5))
        model(x).sum().backward()
        if index == 1:
            break
    # the second step (the first is apart), left by break: its three forward calls, the failed one included
    assert stepwatch.summary().phases["train"].stages["step/forward"].calls == 3
    batches = list(DataLoader(TensorDataset(torch.arange(4)), batch_size=2))
    assert [batch[0].tolist() for batch in batches] == [[0, 1], [2, 3]]


def test_a_loop_under_no_grad_or_in_eval_mode_is_val(auto: None) -> None:
    model = train(epochs=1, batches=3)
    loader = DataLoader(TensorDataset(torch.randn(24, 4)), batch_size=8)
    with torch.no_grad():
        for (x,) in loader:
            model(x)
    model.eval()
    for (x,) in DataLoader(TensorDataset(torch.randn(24, 4)), batch_size=8):  # a new loop, grad enabled
        with torch.no_grad():
            model(x)
    phases = stepwatch.summary().phases
    assert phases["train"].steps == 2 and phases["val"].steps == 4
    assert phases["val"].stages["step/forward"].calls == 4
    assert phases["val"].counters["samples"] == 32


def test_samples_are_counted_exactly_with_a_short_last_batch_and_with_a_collate_of_ones_own(auto: None) -> None:
    """torch's own batching: the first batch is looked into, the full ones after it are counted by the loader's
    batch size, the short last one looked into (3 loops over 30 samples in batches of 8: 8+8+8+6). A collate of
    one's own that drops samples: every batch is looked into."""
    with torch.no_grad():
        for _ in range(3):
            for (_x,) in DataLoader(TensorDataset(torch.randn(30, 4)), batch_size=8):
                pass
    assert stepwatch.summary().phases["val"].counters["samples"] == 90 - 3 * 8  # each loop's first step is apart

    def drop_last_sample(samples: list[Any]) -> Any:
        return torch.utils.data.default_collate(samples[:-1])

    stepwatch.reset()
    with torch.no_grad():
        for (_x,) in DataLoader(TensorDataset(torch.randn(30, 4)), batch_size=8, collate_fn=drop_last_sample):
            pass
    assert stepwatch.summary().phases["val"].counters["samples"] == 7 + 7 + 5  # 7 in the first step, apart


def test_a_loop_guessed_train_that_runs_no_backward_is_renamed_val(auto: None) -> None:
    model = nn.Linear(4, 2)  # training mode, grad enabled: an inference loop looks like training at its start
    for (x,) in DataLoader(TensorDataset(torch.randn(24, 4)), batch_size=8):
        model(x)
    assert list(stepwatch.summary().phases) == ["val"]
    assert stepwatch.summary().phases["val"].stages["step/forward"].calls == 2
    with stepwatch.timed("after"):  # outside any loop: the train phase's root, which the move left in place
        pass
    phases = stepwatch.summary().phases
    assert phases["train"].stages["after"].calls == 1 and "after" not in phases["val"].stages


def test_the_val_phase_name_is_the_users() -> None:
    stepwatch.auto(val_phase="eval")
    try:
        model = nn.Linear(4, 2)
        with torch.no_grad():
            for (x,) in DataLoader(TensorDataset(torch.randn(16, 4)), batch_size=8):
                model(x)
        assert list(stepwatch.summary().phases) == ["eval"]
    finally:
        stepwatch.auto(False)
        stepwatch.disable()
        stepwatch.reset()
    with pytest.raises(ValueError, match="must differ"):
        stepwatch.auto(val_phase="train")
    assert _patches.session is None


def test_validation_inside_a_training_step_is_its_own_phase(auto: None) -> None:
    val_loader = DataLoader(TensorDataset(torch.randn(16, 4)), batch_size=8)

    def body(model: nn.Module, x: torch.Tensor) -> None:
        model.eval()
        for (v,) in val_loader:  # grad still enabled: the loop inside a step is taken for validation
            with torch.no_grad():
                model(v)
        model.train()

    train(epochs=1, batches=3, body=body)
    phases = stepwatch.summary().phases
    assert phases["train"].steps == 2 and phases["train"].stages["step/forward"].calls == 2
    assert phases["val"].steps == 3 and phases["val"].stages["step/forward"].calls == 3


def test_without_dataloader_steps_end_at_optimizer_steps_and_auto_false_ends_them(auto: None) -> None:
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(64, 4)
    for step in range(10):
        loss = model(data[step * 6 : step * 6 + 6]).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print("after the last step: no stage timed, so not a step")
    stepwatch.auto(False)
    train_phase = stepwatch.summary().phases["train"]
    assert train_phase.steps == 8  # the first optimizer step starts the loop, the second ends its first step
    assert train_phase.stages["step/forward"].calls == 8 and train_phase.stages["step/optimizer"].calls == 8
    assert "each step ends at an optimizer step" in stepwatch.summary().metadata["auto"]  # kept after auto(False)


def test_a_final_evaluation_after_the_last_optimizer_step_is_val_and_no_step(auto: None) -> None:
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(5):
        model(torch.randn(3, 4)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    with torch.no_grad():
        for _ in range(4):
            model(torch.randn(3, 4))  # a final evaluation: the val phase, not a training step
    stepwatch.auto(False)
    phases = stepwatch.summary().phases
    train_phase = phases["train"]
    assert train_phase.steps == 3  # 5 optimizer steps: the first starts the loop, the second ends the one-off
    assert train_phase.stages["step/forward"].calls == 3 and train_phase.stages["step/optimizer"].calls == 3
    # the zero_grad after the last optimizer step, alone in the time left, is no step: not counted either
    assert train_phase.stages["step/zero_grad"].calls == 3
    assert "loader" not in train_phase.stages and "first_batch" not in train_phase.stages  # no DataLoader
    assert phases["val"].steps == 4 and phases["val"].stages["step/forward"].calls == 4


def test_once_narrowed_a_forward_without_gradients_in_a_step_is_still_an_evaluation(auto: None) -> None:
    """The compiled module-call wrapper reads torch's grad and inference modes at every call of the model it
    knows (through their C functions): in a narrowed step, the trained model called under ``no_grad``, or
    under ``inference_mode`` even with gradients enabled inside it, is an evaluation, not a training forward."""
    seen = []

    def body(model: nn.Module, x: torch.Tensor) -> None:
        seen.append(None)
        if len(seen) == 6:  # narrowed by now (LEARNING_STEPS = 2)
            with torch.no_grad():
                model(x)
        elif len(seen) == 7:
            with torch.inference_mode(), torch.enable_grad():
                assert torch.is_grad_enabled() and torch.is_inference_mode_enabled()
                model(x)

    train(epochs=1, batches=9, body=body)
    phases = stepwatch.summary().phases
    assert phases["train"].steps == 8 and phases["train"].stages["step/forward"].calls == 8
    assert phases["val"].steps == 2 and phases["val"].stages["step/forward"].calls == 2


def test_once_narrowed_the_models_mode_is_read_as_python_reads_it(auto: None) -> None:
    """The compiled wrapper reads ``training`` from the model's own dictionary only while its class has no
    attribute of that name: a class that makes it a property, even after the steps were narrowed, is read
    through the property (which wins over the dictionary's entry, as in Python), and after it is deleted
    the dictionary is read again."""

    class Net(nn.Sequential):
        pass

    seen = []

    def body(model: nn.Module, x: torch.Tensor) -> None:
        seen.append(None)
        if len(seen) == 6:  # narrowed by now (LEARNING_STEPS = 2)
            Net.training = property(lambda self: False)  # type: ignore[assignment]
            assert vars(model)["training"] is True and not model.training
            model(x)  # with gradients, in eval mode by its class: an evaluation
            del Net.training

    torch.manual_seed(0)
    model = Net(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    criterion, optimizer = nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(8 * 9, 4), torch.randint(0, 2, (8 * 9,))), batch_size=8)
    for x, y in loader:
        optimizer.zero_grad()
        criterion(model(x), y).backward()
        optimizer.step()
        body(model, x)
    phases = stepwatch.summary().phases
    assert phases["train"].steps == 8 and phases["train"].stages["step/forward"].calls == 8
    assert phases["val"].steps == 1 and phases["val"].stages["step/forward"].calls == 1


def test_forwards_of_a_model_never_trained_stay_in_the_step(auto: None) -> None:
    """A frozen teacher (distillation) runs under no_grad in eval mode inside every step: it is part of
    training, not an evaluation."""
    teacher, student = nn.Linear(4, 2).eval(), nn.Linear(4, 2)
    optimizer = torch.optim.SGD(student.parameters(), lr=0.01)
    for _ in range(6):
        x = torch.randn(3, 4)
        with torch.no_grad():
            target = teacher(x)
        (student(x) - target).pow(2).mean().backward()
        optimizer.step()
    stepwatch.auto(False)
    phases = stepwatch.summary().phases
    assert "val" not in phases and phases["train"].steps == 4
    assert phases["train"].stages["step/forward"].calls == 2 * 4


def test_an_evaluation_inside_a_dataloader_step_and_inside_a_users_block(auto: None) -> None:
    """Evaluation forwards of the trained model inside a DataLoader loop's step are val; a user's block
    around them closes normally, and keeps only its time outside the evaluation."""

    def body(model: nn.Module, x: torch.Tensor) -> None:
        with stepwatch.timed("evaluate"):
            model.eval()
            with torch.no_grad():
                for _ in range(3):
                    model(x)
            model.train()

    train(epochs=1, batches=4, body=body)
    phases = stepwatch.summary().phases
    assert phases["train"].steps == 3 and phases["train"].stages["step/forward"].calls == 3
    assert phases["train"].stages["step/evaluate"].calls == 3
    assert phases["val"].steps == 3 * 4 and phases["val"].stages["step/forward"].calls == 3 * 4
    assert stepwatch.summary().metadata["dropped_blocks"] == 0


@pytest.mark.slow
def test_a_nanogpt_shaped_loop_reports_evaluation_as_val(tmp_path: Path) -> None:
    """``stepwatch run`` on a loop shaped like nanoGPT's: batches sliced from a tensor, ``estimate_loss()``
    under no_grad and eval mode every 10 iterations. Checked against the program's own clock."""
    own_file, run_file = tmp_path / "own.json", tmp_path / "run.json"
    result = subprocess.run(
        [PYTHON, "-m", "stepwatch", "run", "-o", str(run_file), str(PROGRAMS / "nanogpt_like.py"), str(own_file)],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    own = json.loads(own_file.read_text())
    summary = stepwatch.load(run_file)
    train_phase, val_phase = summary.phases["train"], summary.phases["val"]
    # the loop starts at the first optimizer step; the one-off first step is apart; the trailing zero_grad is no step
    assert train_phase.steps + 1 == own["optimizer_steps"] - 1
    assert train_phase.stages["step/forward"].calls == train_phase.steps
    assert "loader" not in train_phase.stages
    evaluations_seen = sum(1 for it in own["iterations"][1:] if it["evaluated"])
    assert val_phase.steps == val_phase.stages["step/forward"].calls == evaluations_seen * own["eval_forwards"]
    # the training step is a training iteration only: by the program's own clock, the same iterations (an
    # evaluating one included) less the time its estimate_loss() took. Left in, a preemption under load in one of
    # the evaluating iterations' training work is seen by stepwatch only (it moved the mean 10% with two CPU hogs)
    training_s = [it["s"] - it["evaluation_s"] for it in own["iterations"][2:]]
    assert len(training_s) == train_phase.steps
    assert train_phase.stages["step"].mean == pytest.approx(sum(training_s) / len(training_s), rel=0.1)
    # no step holds an evaluation: each is shorter than an evaluation's own forwards (2 x 5 busy-waits of 2 ms),
    # however the machine preempts a plain step
    evaluation_s = own["eval_forwards"] * own["forward_s"]
    assert train_phase.stages["step"].max_ns * 1e-9 < evaluation_s
    assert "evaluations inside training steps" in summary.metadata["auto"]


def test_calls_from_other_threads_are_not_stages_of_the_step(auto: None) -> None:
    model = nn.Linear(4, 2)
    other = threading.Thread(target=lambda: [model(torch.randn(2, 4)) for _ in range(5)])

    def body(model_: nn.Module, x: torch.Tensor) -> None:
        if not other.is_alive() and other.ident is None:
            other.start()
            other.join()

    train(epochs=1, batches=3, body=body)
    assert stepwatch.summary().phases["train"].stages["step/forward"].calls == 2


def test_calls_from_another_thread_once_narrowed_are_plain_and_the_loop_goes_on(auto: None) -> None:
    """Once the model's class is narrowed (its compiled wrapper where built, which compares the loop's thread
    with the caller's), another thread's forward and backward are no stages, and the loop's own steps are
    still broken down after it, in the next epoch too (whose loop sets its thread again)."""
    steps_seen = []

    def body(model_: nn.Module, x: torch.Tensor) -> None:
        steps_seen.append(None)
        if len(steps_seen) == 6:  # narrowed by now (LEARNING_STEPS = 2)
            work = lambda: [model_(torch.randn(2, 4)).sum().backward() for _ in range(5)]  # noqa: E731
            other = threading.Thread(target=work)
            other.start()
            other.join()

    train(epochs=2, batches=8, body=body)
    train_phase = stepwatch.summary().phases["train"]
    assert train_phase.steps == 14  # two epochs of 8, each one's first step apart
    for stage in ("forward", "loss", "backward", "optimizer"):
        assert train_phase.stages[f"step/{stage}"].calls == train_phase.steps, stage
    # nothing of the other thread's: timed there, its calls would be the phase's top-level forward and backward
    tops = {name.split("/")[0] for name in train_phase.stages}
    assert tops == {"loader", "step", "first_batch", "first_step"}, tops


def test_a_loop_on_a_thread_of_its_own_is_broken_down_once_narrowed(auto: None) -> None:
    """The compiled wrappers tell the loop's thread from the caller's by the interpreter's thread state (not
    ``get_ident()`` itself): a loop run on a thread that is not the main one has every stage of every step,
    before and after the wrappers narrow, and a call from the main thread meanwhile is none."""
    failures: list[BaseException] = []
    main_calls = nn.Linear(4, 2)

    def run() -> None:
        try:
            train(epochs=1, batches=10)
        except BaseException as error:  # reported in the main thread
            failures.append(error)

    worker = threading.Thread(target=run)
    worker.start()
    main_calls(torch.randn(2, 4))  # the main thread: never the loop's
    worker.join()
    assert not failures, failures
    train_phase = stepwatch.summary().phases["train"]
    assert train_phase.steps == 9  # the first step apart
    for stage in ("forward", "loss", "backward", "optimizer", "zero_grad"):
        assert train_phase.stages[f"step/{stage}"].calls == train_phase.steps, stage
    assert {name.split("/")[0] for name in train_phase.stages} == {"loader", "step", "first_batch", "first_step"}


def test_host_to_device_copies_outside_forward_are_h2d(auto: None) -> None:
    """CPU-only here: the meta device stands in for an accelerator (a real one is in scripts/gpu_check.py)."""
    session = _patches.session
    assert session is not None and "to" not in vars(torch.Tensor)  # CPU-only: not patched
    _patches.install_h2d(session.patches, torch)

    class Moving(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x.to("meta")  # inside forward: part of forward
            return x

    model = Moving()
    for (x,) in DataLoader(TensorDataset(torch.randn(16, 4)), batch_size=4):
        x.to("meta", non_blocking=True)
        x.to(torch.float64)  # a dtype: no copy to a device
        x.to("cpu")
        model(x)
    stages = stepwatch.summary().phases["val"].stages
    assert stages["step/h2d"].calls == 3
    assert "step/forward/h2d" not in stages
    assert session.found.describe().endswith(", h2d")


def test_moves_to_device_reads_every_form_of_tensor_to() -> None:
    meta = torch.empty(1, device="meta")
    assert moves_to_device(("cuda",), {})
    assert moves_to_device(("cuda:1",), {"non_blocking": True})
    assert moves_to_device((torch.device("mps"),), {})
    assert moves_to_device((0,), {})
    assert moves_to_device((), {"device": "cuda", "dtype": torch.float16})
    assert moves_to_device((meta,), {})
    assert not moves_to_device((torch.float16,), {})
    assert not moves_to_device(("cpu",), {})
    assert not moves_to_device((torch.ones(1),), {})
    assert not moves_to_device((), {"dtype": torch.float16})
    assert not moves_to_device((True,), {})


def test_a_watched_loader_still_batches_with_torchs_own_collate() -> None:
    """watch() wraps the loader's collate function; underneath it is still torch's, so the full batches need not be
    looked into (auto's sample count used to look into every batch of every loader it watched)."""
    loader = DataLoader(TensorDataset(torch.randn(30, 4)), batch_size=8)
    assert uniform_batches(loader) == (8, 3)
    sw = stepwatch.Stopwatch()
    sw.enable()
    for _ in sw.watch(loader):
        pass
    assert loader.collate_fn is not torch.utils.data.default_collate
    assert uniform_batches(loader) == (8, 3)
    own = DataLoader(TensorDataset(torch.randn(30, 4)), batch_size=8, collate_fn=lambda samples: samples)
    assert uniform_batches(own) == (None, 0)


def test_batch_size_of_common_batch_shapes() -> None:
    assert batch_size(torch.zeros(5, 3)) == 5
    assert batch_size((torch.zeros(7, 2), torch.zeros(7))) == 7
    assert batch_size({"input_ids": torch.zeros(3, 9), "labels": torch.zeros(3)}) == 3
    assert batch_size([[torch.zeros(2, 1)]]) == 2
    assert batch_size(torch.tensor(1.0)) is None
    assert batch_size(["a", "b"]) is None
    assert batch_size(object()) is None


def test_device_timing_is_on_when_a_device_is_given() -> None:
    device = RealtimeDevice()
    stepwatch.auto(device=device)
    try:
        train(epochs=1, batches=3)
        summary = stepwatch.summary()
        assert summary.phases["train"].stages["step/forward"].device is not None
        assert "device timing on" in summary.metadata["auto"]
    finally:
        stepwatch.auto(False)
        stepwatch.disable()
        stepwatch.reset()
        stepwatch._default.device_timer = None
        stepwatch._default.device = None
        stepwatch._default._blocks.clear()
        device.close()


def test_a_compiled_model_keeps_its_graph_and_its_results(auto: None) -> None:
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    compiled = torch.compile(model, backend="eager")
    reference = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    reference.load_state_dict(model.state_dict())
    counters.clear()
    for (x,) in DataLoader(TensorDataset(torch.randn(32, 8)), batch_size=8):
        assert torch.equal(compiled(x), reference(x))
    assert not counters["graph_break"]
    found = _patches.session.found  # type: ignore[union-attr]
    assert "OptimizedModule(Sequential)" in found.forward
    torch._dynamo.reset()

"""The timed block's hot path in C (``_speedups.c``) and its pure-Python twin (``_block_base.py``): the build
makes the C one where it can and never fails where it cannot, and both pass the blocks' tests."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from stepwatch import Stopwatch, _block_base
from stepwatch._blocks import Block

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import hatch_build  # noqa: E402  (the build hook, at the project's root)


def compiler_here() -> bool:
    return hatch_build.toolchain() is not None


def test_the_development_install_runs_the_compiled_blocks_where_a_compiler_is_found() -> None:
    assert compiler_here() == _block_base.COMPILED
    if _block_base.COMPILED:
        assert "__enter__" not in Block.__dict__  # inherited from the C base, not redefined in Python
        assert Block.__mro__[1].__module__ == "stepwatch._speedups"


def test_the_build_compiles_a_module_that_loads(tmp_path: Path) -> None:
    if not compiler_here():
        pytest.fail("this machine was expected to have a C compiler and Python's headers")
    built = hatch_build.build_speedups(tmp_path)
    assert built is not None and built.name == hatch_build.module_name()
    spec = importlib.util.spec_from_file_location("_speedups", built)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert hasattr(module.BlockBase, "__enter__") and hasattr(module.BlockBase, "__exit__")


def test_a_build_that_cannot_compile_says_why_and_stays_pure_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "broken.c"
    broken.write_text("this is not C\n")
    monkeypatch.setattr(hatch_build, "SOURCE", broken)
    assert hatch_build.build_speedups(tmp_path) is None
    assert "the C speedups did not build; stepwatch stays pure Python" in capsys.readouterr().err
    monkeypatch.setenv("LDSHARED", "/nonexistent/compiler")
    assert hatch_build.build_speedups(tmp_path) is None
    assert "could not run the C compiler" in capsys.readouterr().err


def run(command: list[str], **options: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=600, **options)  # type: ignore[call-overload,no-any-return]


@pytest.mark.slow
def test_wheels_with_and_without_a_compiler_install_and_time_blocks(tmp_path: Path) -> None:
    """A wheel built here carries the module and this platform's tag; built where compiling fails (LDSHARED=false),
    it is pure Python, installs into a bare virtual environment and times blocks there."""
    built = run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q", "-w", str(tmp_path / "c")])
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "c").glob("*.whl")
    assert not wheel.name.endswith("py3-none-any.whl")
    assert any(name.startswith("stepwatch/_speedups.") for name in zipfile.ZipFile(wheel).namelist())

    env = {**os.environ, "LDSHARED": "false"}
    built = run(
        [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q", "-w", str(tmp_path / "py")], env=env
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "py").glob("*.whl")
    assert wheel.name.endswith("py3-none-any.whl")
    assert not any("_speedups." in name and not name.endswith(".c") for name in zipfile.ZipFile(wheel).namelist())
    venv = tmp_path / "venv"
    assert run([sys.executable, "-m", "venv", "--without-pip", str(venv)]).returncode == 0
    installed = run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", str(wheel)]
    )
    assert installed.returncode == 0, installed.stderr
    program = (
        "import stepwatch, stepwatch._block_base as base\n"
        "stepwatch.enable()\n"
        "for _ in stepwatch.timed_iter(range(5)):\n"
        "    with stepwatch.timed('forward'):\n"
        "        pass\n"
        "print(base.COMPILED, stepwatch.summary().phases['train'].stages['step/forward'].calls)\n"
    )
    result = run([str(venv / "bin" / "python"), "-c", program], cwd=tmp_path, env={"PATH": os.environ["PATH"]})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "4"]  # the first step of the loop is recorded apart


@pytest.mark.slow
def test_the_pure_python_blocks_pass_the_blocks_tests() -> None:
    """The tests of blocks, loops, switching, workers and auto()'s wrappers, again in a process that runs the
    Python twin."""
    env = {**os.environ, "STEPWATCH_PURE_PYTHON": "1"}
    check = run([sys.executable, "-c", "import stepwatch._block_base as b; print(b.COMPILED)"], env=env)
    assert check.stdout.strip() == "False", check.stderr
    tests = ["tests/test_recorder.py", "tests/test_switching.py", "tests/test_stats.py", "tests/test_trace.py"]
    tests += ["tests/test_auto.py", "tests/test_module_calls.py"]  # auto()'s wrappers: Python, not AutoCall
    result = run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests], cwd=ROOT, env=env)
    assert result.returncode == 0, result.stdout[-3000:]
    assert " passed" in result.stdout and "failed" not in result.stdout


def compiled_and_pure_output(program: str) -> str:
    """What ``program`` prints with the compiled blocks (where built) and with the Python twin, which must be the
    same: that output."""
    here = run([sys.executable, "-c", program])
    pure = run([sys.executable, "-c", program], env={**os.environ, "STEPWATCH_PURE_PYTHON": "1"})
    assert here.returncode == 0 and pure.returncode == 0, here.stderr + pure.stderr
    assert here.stdout == pure.stdout
    return here.stdout


def test_the_compiled_blocks_record_what_the_python_ones_do() -> None:
    """The same nested blocks, an exception through one and a block closed out of order, in this process (the
    compiled blocks where built) and in one running the Python twin: the same calls, the same drops."""
    program = (
        "import stepwatch\n"
        "sw = stepwatch.Stopwatch()\n"
        "sw.enable()\n"
        "for i in sw.timed_iter(range(6)):\n"
        "    with sw.timed('a'):\n"
        "        with sw.timed('b'):\n"
        "            pass\n"
        "    try:\n"
        "        with sw.timed('c'):\n"
        "            raise KeyError(i)\n"
        "    except KeyError:\n"
        "        pass\n"
        "    outer, inner = sw.timed('d'), sw.timed('e')\n"
        "    outer.__enter__(); inner.__enter__(); outer.__exit__(None, None, None); inner.__exit__(None, None, None)\n"
        "s = sw.summary()\n"
        "print(sorted((p, st.calls) for p, st in s.phases['train'].stages.items() if not p.endswith('other')))\n"
        "print(sw.span.dropped_blocks)\n"
    )
    here = compiled_and_pure_output(program)
    assert "('step/a/b', 5)" in here and "('step/c', 5)" in here


def test_clock_readings_of_every_size_give_the_durations_python_gives() -> None:
    """The ints a block reads from its clock and the durations it makes of them (``elapsed_since`` and
    ``difference`` in C: ints that fit in 64 bits as such, any other through Python's subtraction): readings on
    each side of an int's 30-bit digits, of 2**60 and 2**63, negative and of mixed signs, durations from 0 up, each
    a block's only pair of readings. In C and in the Python twin: each stage's total, minimum and maximum are the
    end minus the start."""
    program = (
        "import stepwatch\n"
        "pairs = [(0, 256), (1, 258), (5, 5), (2**30 - 1, 2**31 - 1), (2**30, 2**30 + 7), (2**60 - 5, 2**60 + 5),\n"
        "         (2**60 - 1, 2**61), (2**62, 2**63 - 1), (-(2**40), -(2**40) + 1000), (-5, 5), (10, 2**59),\n"
        "         (0, 2**30), (1, 2**30), (0, 2**60 - 1), (0, 2**60), (2**60 - 1, 2**60 - 1), (-1, 300)]\n"
        "readings = []\n"
        "sw = stepwatch.Stopwatch(clock=lambda: readings.pop(0) if readings else 0)\n"
        "sw.enable()\n"
        "for index, pair in enumerate(pairs):\n"
        "    readings[:] = pair\n"
        "    with sw.timed(f'b{index}'):\n"
        "        pass\n"
        "stages = sw.summary().phases['train'].stages\n"
        "for index, (start, end) in enumerate(pairs):\n"
        "    st = stages[f'b{index}']\n"
        "    assert st.total_ns == st.min_ns == st.max_ns == end - start, (start, end, st)\n"
        "    print(index, st.total_ns, type(st.total_ns).__name__)\n"
    )
    here = compiled_and_pure_output(program)
    assert here.splitlines()[7] == f"7 {2**63 - 1 - 2**62} int", here


def test_the_blocks_common_case_and_every_case_it_hands_on_record_what_the_python_ones_do() -> None:
    """The compiled block's compact common case hands each other case, before writing anything, to the general
    one: a stage's buffer filling up (a fold, at every FOLD-th exit), a new thread, a new child, a block left open
    by the one closed after it, a stage's buffer that is a list subclass. In C and in the Python twin: the same
    calls, totals no longer than the run, drops the same."""
    program = (
        "import threading, time\n"
        "import stepwatch\n"
        "from stepwatch._constants import FOLD\n"
        "sw = stepwatch.Stopwatch()\n"
        "sw.enable()\n"
        "began = time.perf_counter_ns()\n"
        "for i in sw.timed_iter(range(FOLD + 3)):\n"
        "    with sw.timed('a'):\n"
        "        with sw.timed('b' if i % 7 else 'c'):\n"
        "            pass\n"
        "    if i == 5:\n"
        "        class Listed(list):\n"
        "            pass\n"
        "        sw.tree.phases['train'].root.children['step'].children['a'].buf = Listed()\n"
        "    if i % 100 == 0:\n"
        "        outer, inner = sw.timed('d'), sw.timed('e')\n"
        "        outer.__enter__(); inner.__enter__(); outer.__exit__(None, None, None)\n"
        "        inner.__exit__(None, None, None)\n"
        "        worker = threading.Thread(target=lambda: sw.timed('t').__enter__() or sw.timed('t').__exit__(\n"
        "            None, None, None))\n"
        "        worker.start(); worker.join()\n"
        "run_ns = time.perf_counter_ns() - began\n"
        "s = sw.summary()\n"
        "stages = s.phases['train'].stages\n"
        "print(sorted((p, st.calls) for p, st in stages.items() if not p.endswith('other')))\n"
        "print(sw.span.dropped_blocks)\n"
        "assert all(0 <= st.total_ns <= run_ns for st in stages.values()), 'a total longer than the run'\n"
    )
    here = compiled_and_pure_output(program)
    # (the 5 steps' entries in step/a's buffer when it was replaced are not counted, in either)
    assert "('step/a', 1021)" in here and "('step/a/b', 880)" in here, here
    assert "('step/a/c', 146)" in here and "('t', 11)" in here, here
    assert here.splitlines()[-1] == "22"  # d and e, closed out of order, each of the 11 times


def test_a_finalizer_that_times_a_block_inside_a_blocks_entry_leaves_the_stack_whole() -> None:
    """Opening a block allocates its frame, and an allocation may collect garbage, whose finalizers run Python
    code: here each collection's finalizer opens and closes blocks of its own (the thread's stack reallocated
    deeper) inside the entry that is allocating. The compact entry holds the stack and the node across the
    allocation and pushes onto the stack as it is then: every block recorded under its parent, nothing dropped,
    the stack back to its root."""
    import gc

    sw = Stopwatch()
    sw.enable()

    class TimesWhenCollected:
        def __init__(self) -> None:
            self.cycle = self

        def __del__(self) -> None:
            with sw.timed("finalizer"):
                for _ in range(40):  # a deeper stack than the list had room for, then back
                    sw.timed("deep").__enter__()
                for _ in range(40):
                    sw.timed("deep").__exit__(None, None, None)

    threshold = gc.get_threshold()
    gc.set_threshold(1)  # every allocation of a tracked object collects: the frame's too
    try:
        for _ in range(30):
            TimesWhenCollected()
            with sw.timed("outer"):
                TimesWhenCollected()
                with sw.timed("inner"):
                    pass
    finally:
        gc.set_threshold(*threshold)
    gc.collect()
    assert sw.stacks.thread_stack() == [sw.stacks.thread_stack()[0]]  # only the root frame left open
    stages = sw.summary().phases["train"].stages
    assert stages["outer"].calls == 30 and stages["outer/inner"].calls == 30
    finalized = sum(st.calls for path, st in stages.items() if path.endswith("finalizer"))
    assert finalized == 60
    assert sw.span.dropped_blocks == 0


def test_a_thread_never_finds_the_stack_of_an_ended_thread_with_its_identity() -> None:
    """The compiled block caches the last thread's stack; a thread that ended inside a block leaves its stack
    there, and a new thread (often given the ended one's identity) must get a stack of its own."""
    import threading

    sw = Stopwatch()
    sw.enable()
    identities = []

    def leave_open() -> None:
        identities.append(threading.get_ident())
        sw.timed("left_open").__enter__()  # never exited: this thread ends inside it

    def time_one() -> None:
        identities.append(threading.get_ident())
        with sw.timed("own"):
            pass

    for target in (leave_open, time_one, time_one):
        thread = threading.Thread(target=target)
        thread.start()
        thread.join()
    stages = sw.summary().phases["train"].stages
    assert stages["own"].calls == 2 and not any(path.startswith("left_open/") for path in stages)
    assert len(identities) == 3


def test_a_block_reads_the_default_clock_as_time_perf_counter_ns_does() -> None:
    """The compiled block reads ``time.perf_counter_ns`` (CLOCK_MONOTONIC on Linux) without calling it: its start
    and end lie between two reads of the function, on the same time line; another clock is still called."""
    import time

    sw = Stopwatch()
    sw.enable()
    block = sw.timed("clocked")
    before = time.perf_counter_ns()
    block.__enter__()
    start = sw.stacks.thread_stack()[-1][2]
    block.__exit__(None, None, None)
    after = time.perf_counter_ns()
    elapsed = sw.tree.phases["train"].root.children["clocked"].buf[-1]
    assert before <= start <= after and 0 <= elapsed <= after - before
    ticks = iter(range(1000, 10**6, 1000))
    counted = Stopwatch(clock=lambda: next(ticks))
    counted.enable()
    with counted.timed("ticked"):
        pass
    assert counted.tree.phases["train"].root.children["ticked"].buf[-1] == 1000


def test_the_compiled_step_boundary_does_what_the_python_one_does() -> None:
    """A timed loop's steady step boundary (``swap_frame``), in C and in Python, at each of its conditions: the
    frame on top or not, of its node or not, the thread's stack switched, not measuring at a step's end; each
    either reads the clock once and swaps the frame (closing it into the node's buffer and the phase, counting
    the step in the schedule where asked) or changes nothing and reads no clock."""
    from stepwatch import _block_base
    from stepwatch._tree import LOOP

    if not _block_base.COMPILED:
        pytest.fail("the development install was expected to build the C speedups")

    def outcomes(swap: Any) -> list[Any]:
        sw = Stopwatch()
        sw.enable()
        phase = sw.tree.phase("train")
        body, wait = sw.tree.add_child(phase.root, "step"), sw.tree.add_child(phase.root, "loader")
        stack = sw.stacks.thread_stack()
        local = sw.stacks.local
        seen: list[Any] = []

        def attempt(
            frame: Any, node: Any, next_node: Any, now: int, ends: bool, counted: bool = False, local: Any = local
        ) -> None:
            reads: list[int] = []

            def clock() -> int:
                reads.append(now)
                return now

            opened = swap(sw.stacks, local, stack, frame, node, next_node, phase, clock, ends, counted)

            def named(frame: Any) -> Any:  # a frame with its node's path: comparable across the two stopwatches
                return None if frame is None else (frame[0] is LOOP, frame[1].path, frame[2])

            assert opened is None or opened is stack[-1]
            frames = [named(frame) for frame in stack[1:]]
            counts = (phase.loop_ns, phase.steps, phase.schedule_pos)
            seen.append((named(opened), len(reads), frames, list(body.buf), list(wait.buf), *counts))

        frame = (LOOP, body, 100)
        stack.append(frame)
        attempt(frame, wait, body, 150, True)  # not the frame's node
        attempt((LOOP, body, 100), body, wait, 150, True)  # not the frame on top
        attempt(frame, body, wait, 150, True, local=object())  # the stack was switched
        sw.stacks.measuring = False
        attempt(frame, body, wait, 150, True)  # not measuring at the end of a step
        sw.stacks.measuring = True
        attempt(frame, body, wait, 150, True)  # the step ends, the wait opens
        attempt(stack[-1], wait, body, 190, False, counted=True)  # the wait ends, the step opens and counts
        attempt(stack[-1], body, wait, 230, True)  # the step ends
        attempt(stack[-1], wait, body, 260, False)  # a step that does not count (a warm-up step)
        stack.clear()
        attempt(frame, body, wait, 200, True)  # an empty stack
        return seen

    compiled = outcomes(_block_base.swap_frame)
    assert compiled == outcomes(_block_base.python_swap_frame)
    assert [seen[0] is None for seen in compiled] == [True, True, True, True, False, False, False, False, True]
    assert [seen[1] for seen in compiled] == [0, 0, 0, 0, 1, 1, 1, 1, 0]  # the clock read only by a swap
    assert compiled[4] == ((True, "loader", 150), 1, [(True, "loader", 150)], [50], [], 50, 1, 0)
    assert compiled[5] == ((True, "step", 190), 1, [(True, "step", 190)], [50], [40], 90, 1, 1)
    assert compiled[7] == ((True, "step", 260), 1, [(True, "step", 260)], [50, 40], [40, 30], 160, 2, 1)


def test_the_compiled_step_boundary_reads_the_default_clock_itself() -> None:
    """With ``time.perf_counter_ns`` as the clock, the C boundary reads it without a call: the reading lies
    between two readings taken around the swap, and the closed frame's duration is the reading less its start."""
    import time

    from stepwatch import _block_base
    from stepwatch._tree import LOOP

    sw = Stopwatch()
    sw.enable()
    phase = sw.tree.phase("train")
    body, wait = sw.tree.add_child(phase.root, "step"), sw.tree.add_child(phase.root, "loader")
    stack = sw.stacks.thread_stack()
    start = time.perf_counter_ns() - 5_000
    frame = (LOOP, body, start)
    stack.append(frame)
    before = time.perf_counter_ns()
    opened = _block_base.swap_frame(
        sw.stacks, sw.stacks.local, stack, frame, body, wait, phase, time.perf_counter_ns, True, False
    )
    after = time.perf_counter_ns()
    assert opened is not None and opened is stack[-1] and opened[1] is wait
    assert before <= opened[2] <= after
    assert body.buf == [opened[2] - start]
    assert phase.loop_ns == opened[2] - start and phase.steps == 1


def test_blocks_found_by_name_and_by_parent_record_what_the_python_ones_do() -> None:
    """The C paths find a block by its stage name (``timed``) and its node among its parent's children: the same
    block under two parents in turn, stage names built anew at each call, siblings added between two entries, a
    hundred and fifty names under one parent, and stopwatches made and freed (new dictionaries where the old ones
    were) record what the Python twin records."""
    program = (
        "import stepwatch\n"
        "sw = stepwatch.Stopwatch()\n"
        "sw.enable()\n"
        "for i in sw.timed_iter(range(40)):\n"
        "    for parent in ('a', 'b'):\n"
        "        with sw.timed(parent):\n"
        "            with sw.timed(''.join(['for', 'ward'])):\n"
        "                pass\n"
        "            with sw.timed(f'new{i % 7}'):\n"
        "                pass\n"
        "    with sw.timed('many'):\n"
        "        for k in range(150):\n"
        "            with sw.timed(f's{k}'):\n"
        "                pass\n"
        "s = sw.summary()\n"
        "calls = {p: st.calls for p, st in s.phases['train'].stages.items() if not p.endswith('other')}\n"
        "print(sorted(calls.items()))\n"
        "for run in range(20):\n"  # stopwatches made and freed: new dictionaries where the old ones were
        "    sw = stepwatch.Stopwatch()\n"
        "    sw.enable()\n"
        "    for i in sw.timed_iter(range(3 + run)):\n"
        "        with sw.timed('a'):\n"
        "            with sw.timed('forward'):\n"
        "                pass\n"
        "    print(sw.summary().phases['train'].stages['step/a/forward'].calls, end=' ')\n"
    )
    here = compiled_and_pure_output(program)
    assert here.endswith(" ".join(str(2 + run) for run in range(20)) + " ")
    assert "('step/a/forward', 39)" in here and "('step/b/forward', 39)" in here  # (the first step apart)
    assert "('step/a/new6', 5)" in here and "('step/many/s149', 39)" in here


@pytest.mark.skipif(sys.implementation.name != "cpython", reason="an object's layout in memory is CPython's")
def test_the_slots_a_block_reads_lie_first_in_the_thread_stacks_object() -> None:
    """The four slots a block reads on its way in and out (``HotFlags``) lie right after the object's header, in
    the header's cache line, not sorted among ThreadStacks' other slots by name, 56 to 88 bytes in: read from
    the object's memory, each slot's pointer is where the layout says (nothing in behaviour shows it)."""
    import ctypes

    from stepwatch._stacks import ThreadStacks

    stacks = Stopwatch().stacks
    assert type(stacks) is ThreadStacks
    header = object.__basicsize__
    pointer = ctypes.sizeof(ctypes.c_void_p)
    hot_slots = ("hot", "local", "measuring", "timeline")  # named here: the layout is what is checked
    for index, name in enumerate(hot_slots):
        value = object()  # a value of its own: False in two of them would not tell them apart
        setattr(stacks, name, value)
        stored = ctypes.c_void_p.from_address(id(stacks) + header + index * pointer).value
        assert stored == id(value), f"ThreadStacks.{name} is not slot {index} after the header"
    assert header + len(hot_slots) * pointer <= 64  # within the header's cache line


def test_the_compiled_timed_lookup_gives_what_the_method_gives() -> None:
    """``sw.timed`` in C (``_lookup.c``): a name used before is read from the blocks by name, anything else goes to
    ``Stopwatch.timed``: the same block, the same errors; lent another stopwatch's state, it reads that one's."""
    from stepwatch import _default_instance

    if not _block_base.COMPILED:
        pytest.fail("the development install was expected to build the C speedups")
    sw = Stopwatch()
    assert type(sw.timed).__name__ == "Lookup"
    made = Stopwatch.timed(sw, "forward")
    assert sw.timed("forward") is made and sw.timed("new") is Stopwatch.timed(sw, "new")
    for bad in ("a/b", "", ["x"], 3):
        with pytest.raises(ValueError) as compiled:
            sw.timed(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError) as method:
            Stopwatch.timed(sw, bad)  # type: ignore[arg-type]
        assert str(compiled.value) == str(method.value)
    with pytest.raises(TypeError):
        sw.timed()  # type: ignore[call-arg]
    other = Stopwatch()
    other.enable()
    theirs = other.timed("forward")
    default = _default_instance.stopwatch
    import stepwatch

    own = stepwatch.timed("forward")  # the default's own block of that name
    with _default_instance.lent_to(other):
        assert stepwatch.timed("forward") is theirs  # the default's lookup, pointed at the lent state
    assert stepwatch.timed("forward") is own is Stopwatch.timed(default, "forward")


def test_the_compiled_lookup_and_counter_refuse_keyword_arguments_when_made() -> None:
    """``Lookup`` and ``Counter`` take their two objects by position; a keyword is refused, not ignored."""
    if not _block_base.COMPILED:
        pytest.fail("the development install was expected to build the C speedups")
    sw = Stopwatch()
    for made in (sw.timed, sw.count):
        kind = type(made)
        with pytest.raises(TypeError, match=rf"^{kind.__name__}\(\) takes no keyword arguments$"):
            kind(sw, made, extra=1)
        with pytest.raises(TypeError):
            kind(sw)

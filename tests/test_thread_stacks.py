"""Each thread's stack of open blocks, as the compiled blocks find it (``_threads.c``): found once per thread for the
stacks' thread-local, kept in C's thread-local storage and held for the thread's state, so that each thread keeps
its own, a switch reads it again, and a thread state made anew on the same OS thread (C code calling into Python
from threads of its own) never finds the stack its previous state left open."""

from __future__ import annotations

import ctypes
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from stepwatch import Stopwatch, _block_base

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import hatch_build  # noqa: E402  (the build hook, at the project's root)

pytestmark = pytest.mark.skipif(
    not _block_base.COMPILED, reason="the compiled blocks were not built (pure-Python install)"
)

FOREIGN_THREAD = r"""
#include <pthread.h>

typedef void (*callback)(int);

static void *
call_twice(void *function)
{
    callback call = *(callback *)function;
    call(0);
    call(1);
    return NULL;
}

/* Calls ``call`` twice on one new thread of its own, which Python has never seen. */
int
run_on_a_foreign_thread(callback call)
{
    pthread_t thread;
    if (pthread_create(&thread, NULL, call_twice, &call) != 0) {
        return -1;
    }
    return pthread_join(thread, NULL);
}
"""


def foreign_thread_library(directory: Path) -> ctypes.CDLL:
    """A small C library, compiled here, that starts a thread of its own and calls back into Python from it."""
    tools = hatch_build.toolchain()
    assert tools is not None  # the compiled blocks were built, so a compiler is here
    source, library = directory / "foreign.c", directory / "foreign.so"
    source.write_text(FOREIGN_THREAD)
    subprocess.run([*tools[0], "-fPIC", "-pthread", str(source), "-o", str(library)], check=True)
    return ctypes.CDLL(str(library))


def test_a_thread_state_made_anew_on_the_same_thread_never_finds_the_stack_left_open_by_the_last(
    tmp_path: Path,
) -> None:
    library = foreign_thread_library(tmp_path)
    sw = Stopwatch()
    sw.enable()
    marker = threading.local()
    seen: list[tuple[int, bool]] = []
    errors: list[BaseException] = []

    @ctypes.CFUNCTYPE(None, ctypes.c_int)
    def call(round_: int) -> None:  # each call: a thread state made for it and cleared after (ctypes)
        try:
            seen.append((threading.get_native_id(), hasattr(marker, "set")))
            marker.set = True
            if round_ == 0:
                sw.timed("left_open").__enter__()  # never exited: this thread state ends inside it
            else:
                with sw.timed("own"):
                    pass
        except BaseException as error:  # an exception in a ctypes callback is printed, not raised: kept here
            errors.append(error)

    assert library.run_on_a_foreign_thread(call) == 0
    assert not errors, errors
    # the two calls ran on one OS thread, each in a thread state of its own (the first's thread-local gone)
    assert len(seen) == 2 and seen[0][0] == seen[1][0] and seen == [(seen[0][0], False), (seen[0][0], False)]
    stages = sw.summary().phases["train"].stages
    assert stages["own"].calls == 1 and "left_open/own" not in stages


def test_each_thread_keeps_the_stack_it_found_while_others_time_blocks_of_their_own() -> None:
    sw = Stopwatch()
    sw.enable()
    inside, done = threading.Event(), threading.Event()

    def worker() -> None:
        inside.wait()
        for _ in range(3):
            with sw.timed("worker"), sw.timed("inner"):
                pass
        done.set()

    thread = threading.Thread(target=worker)
    thread.start()
    with sw.timed("outer"):
        inside.set()
        done.wait()  # the worker's blocks all ran while this thread is inside "outer"
        with sw.timed("inner"):
            pass
    thread.join()
    stages = sw.summary().phases["train"].stages
    assert stages["outer"].calls == 1 and stages["outer/inner"].calls == 1
    assert stages["worker"].calls == 3 and stages["worker/inner"].calls == 3
    assert not any(path.startswith(("outer/worker", "worker/outer")) for path in stages)


def test_a_switch_gives_the_stacks_a_new_thread_local_whose_stack_is_read_again() -> None:
    """``disable()`` then ``enable()`` replace the stacks' thread-local: the stack this thread found before (with
    ``before`` open on it) is not used again, so a block inside ``before`` is dropped, never recorded under it."""
    sw = Stopwatch()
    sw.enable()
    before = sw.timed("before")
    before.__enter__()
    sw.disable()
    sw.enable()
    with sw.timed("after"):
        pass
    before.__exit__(None, None, None)
    with sw.timed("later"):
        pass
    assert list(sw.summary().phases["train"].stages) == ["later"]

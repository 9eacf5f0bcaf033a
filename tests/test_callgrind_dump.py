"""The reader of callgrind dumps behind ``benchmarks/footprint.py``'s counts (stepwatch's compiled code's lines
a step, and each function's): self costs only, compressed names resolved wherever they first appear, a
function's recursive calls counted with it; the calls to one function (pymalloc's pools made ready) counted."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from callgrind_dump import calls_to, self_costs  # a benchmark's helper, beside it

DUMP = """# callgrind format
version: 1
positions: line
events: Ir ILmr DLmr
summary: 1000 30 40
ob=(1) /usr/lib/libpython3.11.so
fl=(1) ceval.c
fn=(1) eval
10 100 5 6
cob=(2) /src/stepwatch/_speedups.cpython-311.so
cfi=(2) ???
cfn=(2) block_exit
calls=3 0
+2 900 20 30
+1 7 1 0
ob=(2)
fl=(2)
fn=(2)
0 50 4 8
fn=(3) block_enter
0 20 2 1
calls=1 0
0 11 0 0
ob=(1)
fn=(1)
* 3 0 1
fn=(4) eval'2
0 40 2 2
"""


def test_self_costs_leave_out_the_calls_and_resolve_compressed_names() -> None:
    totals, by_function = self_costs(DUMP)
    assert totals == {"Ir": 1000, "ILmr": 30, "DLmr": 40}
    assert by_function == {
        "libpython3.11.so:eval": {"Ir": 150, "ILmr": 8, "DLmr": 9},  # 100 + 7 + 3, eval'2's 40: the call's 900 out
        "_speedups.cpython-311.so:block_exit": {"Ir": 50, "ILmr": 4, "DLmr": 8},  # named first as a callee
        "_speedups.cpython-311.so:block_enter": {"Ir": 20, "ILmr": 2, "DLmr": 1},  # its call's 11 left out
    }


def test_a_dump_without_its_events_or_summary_is_refused() -> None:
    with pytest.raises(RuntimeError, match="no events or summary"):
        self_costs("# callgrind format\nfn=(1) f\n0 1\n")


def test_calls_to_a_function_are_summed_under_each_call_site_by_its_compressed_name() -> None:
    """A callee named once (``cfn=(2) name``), then by its number alone from a second caller and for its own
    costs: both call sites counted; a caller never called, and another callee's calls, are not."""
    dump = """events: Ir
summary: 10
fn=(1) step
cfn=(2) allocate_from_new_pool
calls=3 0
5 40
cfn=(3) other
calls=7 0
5 9
fn=(4) collate
cfn=(2)
calls=2 0
1 20
fn=(2)
0 30
"""
    assert calls_to(dump, "allocate_from_new_pool") == 5
    assert calls_to(dump, "other") == 7
    assert calls_to(dump, "step") == 0
    assert calls_to(DUMP, "block_exit") == 3  # the shared dump: its one call site

"""Self costs read from a callgrind dump, summed by function, calls to one function counted, and two ways' costs
compared by function (for ``footprint.py``; not a test).

A dump lists, under each function (``fn=``, within its object file ``ob=``), the costs of its own lines, then
for each call it makes a ``calls=`` line followed by the callee's inclusive cost, which is left out here: what is
summed is each function's self cost. Names are compressed (``fn=(12) name`` once, then ``fn=(12)``); a callee's
(``cfn=``, ``cob=``) shares the table of its kind, so a name may first appear in either. A dump taken after
``--zero-before`` lists more than its summary counts (about 50,000 code lines more in 20 steps of
``footprint.py``'s loop, the same in each of its ways): read differences between ways, not the sums alone.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

Costs = dict[str, int]
NAME = re.compile(r"(c?(?:ob|fn))=(?:\((\d+)\))?(?: ?(.*))?")
RECURSION = re.compile(r"'\d+$")  # callgrind's name for a function called within itself, by depth


def resolved_name(match: re.Match[str], tables: dict[str, dict[str, str]]) -> str | None:
    """The name a ``NAME`` line gives: its compressed number looked up in its kind's table (``ob`` or ``fn``; a
    callee's ``cob=`` and ``cfn=`` share them), and learnt there where the line also spells it; None where the
    number was never spelled."""
    kind, compressed, name = match.group(1).removeprefix("c"), match.group(2), match.group(3)
    if compressed is None:
        return name
    return tables[kind].setdefault(compressed, name) if name else tables[kind].get(compressed)


def self_costs(text: str) -> tuple[Costs, dict[str, Costs]]:
    """The dump's totals (its ``summary`` line) and the self costs of each function (``object file
    name:function``, its recursive calls' costs with its own), by event (``Ir``, ``ILmr``, ...)."""
    events = re.search(r"^events:\s*(.+)$", text, re.M)
    summary = re.search(r"^summary:\s*(.+)$", text, re.M)
    if events is None or summary is None:
        raise RuntimeError("callgrind's dump has no events or summary line")
    names = events.group(1).split()
    totals = dict(zip(names, [int(v) for v in summary.group(1).split()] + [0] * len(names), strict=False))
    tables: dict[str, dict[str, str]] = {"ob": {}, "fn": {}}
    current = {"ob": "?", "fn": "?"}
    costs: dict[str, Costs] = defaultdict(lambda: dict.fromkeys(names, 0))
    skip_next = False
    for line in text.splitlines():
        if line.startswith(("ob=", "cob=", "fn=", "cfn=")):
            match = NAME.match(line)
            if match is None:
                continue
            if not match.group(1).startswith("c"):
                current[match.group(1)] = resolved_name(match, tables) or "?"
            else:
                resolved_name(match, tables)  # a callee's name, learnt for the lines that give its number alone
        elif line.startswith("calls="):
            skip_next = True
        elif line[:1].isdigit() or line[:1] in "+-*":
            if skip_next:  # the call's inclusive cost: the callee's, not this function's
                skip_next = False
                continue
            function = RECURSION.sub("", current["fn"])  # its deeper calls (``eval'2``) are the same function
            cost = costs[f"{current['ob'].rsplit('/', 1)[-1]}:{function}"]
            for event, value in zip(names, line.split()[1:], strict=False):
                cost[event] += int(value)
    return totals, dict(costs)


def calls_to(text: str, function: str) -> int:
    """How many times the dump's functions called ``function`` (by its name, as ``fn=`` gives it): the sum of the
    ``calls=`` lines under each ``cfn=`` naming it. A function's names are one table for ``fn=`` and ``cfn=``."""
    tables: dict[str, dict[str, str]] = {"ob": {}, "fn": {}}
    total, callee = 0, None
    for line in text.splitlines():
        if line.startswith(("fn=", "cfn=")):
            match = NAME.match(line)
            if match is None:
                continue
            name = resolved_name(match, tables)
            callee = name if match.group(1) == "cfn" else None
        elif line.startswith("calls=") and callee == function:
            total += int(line.split()[0].removeprefix("calls="))
    return total


def added_by_function(way: dict[str, Any], plain: dict[str, Any], top: int) -> list[dict[str, Any]]:
    """The ``top`` functions whose misses a step differ most between a way and the plain loop: lines of code and
    of data each (self costs; a function the plain loop did not run counts whole). stepwatch's compiled
    functions are exact; the interpreter's and the libraries' move with the heap's layout, by a few lines each
    between two processes, and their sum by about 50 lines a step."""
    rows = []
    for name in way["functions"].keys() | plain["functions"].keys():
        code, data = way["functions"].get(name, (0.0, 0.0))
        plain_code, plain_data = plain["functions"].get(name, (0.0, 0.0))
        code, data = code - plain_code, data - plain_data
        rows.append(
            {
                "function": name,
                "lines": round(code + data, 1),
                "code_lines": round(code, 1),
                "data_lines": round(data, 1),
            }
        )
    return sorted(rows, key=lambda row: -abs(row["lines"]))[:top]

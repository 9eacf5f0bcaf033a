"""Self costs read from a callgrind dump, summed by function (for ``footprint.py``; not a test).

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

Costs = dict[str, int]
NAME = re.compile(r"(c?(?:ob|fn))=(?:\((\d+)\))?(?: ?(.*))?")
RECURSION = re.compile(r"'\d+$")  # callgrind's name for a function called within itself, by depth


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
            kind = match.group(1).removeprefix("c")
            compressed, name = match.group(2), match.group(3)
            if compressed is not None:
                name = tables[kind].setdefault(compressed, name) if name else tables[kind].get(compressed, "?")
            if not match.group(1).startswith("c"):
                current[kind] = name or "?"
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

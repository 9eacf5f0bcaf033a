"""The known workload the test programs put in their datasets: a busy-wait that keeps its own total."""

import time

BUSY_NS = [0]
"""Nanoseconds busy-waited in this process, by the workload's own clock: the truth a test compares with."""


def busy_wait(seconds):
    """Busy-waits at least ``seconds`` and adds how long it really took to :data:`BUSY_NS`."""
    start = time.perf_counter_ns()
    while time.perf_counter_ns() - start < seconds * 1e9:
        pass
    BUSY_NS[0] += time.perf_counter_ns() - start

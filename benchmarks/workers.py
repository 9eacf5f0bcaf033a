"""Cost of bringing worker timings back to the main process (run by hand; not a test).

Transport per batch: in a worker, handing over the batch's measurements (``_take``), building the report and
the carrier; pickling and unpickling the carrier's report, as the DataLoader's queue does; in the main
process, filing the report under the loader stage. Measured in one process on a realistic batch (32 samples,
each with a ``dataset`` read and one transform, one ``collate``), medians over repeats. Target: under 20 us
per batch. Also measured end to end: a real DataLoader with 2 workers over a dataset that does no work,
plain against ``watch``, per batch (this includes the timed blocks themselves, not only the transport).
Writes ``benchmarks/results/workers.json``.
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import stepwatch
from stepwatch._dataloader.in_workers import Carrier, WorkerReport

RESULTS = Path(__file__).resolve().parent / "results"


def transport_ns(samples: int, repeats: int, rounds: int) -> dict[str, float]:
    worker = stepwatch.Stopwatch()
    worker.enable()
    main = stepwatch.Stopwatch()
    main.enable()
    dataset, augment, collate = worker.timed("dataset"), worker.timed("augment"), worker.timed("collate")
    iterator = iter(main.timed_iter(range(10**9)))
    next(iterator)  # the main process is inside a step, as when the next batch arrives
    take_times, pickle_times, receive_times = [], [], []
    for _ in range(repeats):
        take = pick = receive = 0
        for _ in range(rounds):
            for _ in range(samples):
                with dataset, augment:
                    pass
            with collate:
                pass
            start = time.perf_counter_ns()
            report: WorkerReport = (0, 1, 0, 1000, time.perf_counter_ns(), worker.workers.take())
            carrier = Carrier(None, report)
            middle = time.perf_counter_ns()
            received: Carrier = pickle.loads(pickle.dumps(carrier, protocol=pickle.HIGHEST_PROTOCOL))
            after_pickle = time.perf_counter_ns()
            main.workers.receive(received.report)
            end = time.perf_counter_ns()
            take += middle - start
            pick += after_pickle - middle
            receive += end - after_pickle
        take_times.append(take / rounds)
        pickle_times.append(pick / rounds)
        receive_times.append(receive / rounds)
    figures = {
        "take_fold_and_report_ns": statistics.median(take_times),
        "pickle_round_trip_ns": statistics.median(pickle_times),
        "receive_ns": statistics.median(receive_times),
    }
    figures["total_ns"] = sum(figures.values())
    assert main.summary().stages["step/dataset"].calls == samples * rounds * repeats
    return figures


def end_to_end_us(batches: int, repeats: int) -> dict[str, float]:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    data = TensorDataset(torch.arange(batches * 32 * 8, dtype=torch.float32).reshape(-1, 8))

    def run(watched: bool) -> float:
        loader = DataLoader(data, batch_size=32, num_workers=2, persistent_workers=True, prefetch_factor=4)
        sw = stepwatch.Stopwatch()
        sw.enable()
        iterable: Any = sw.watch(loader) if watched else loader
        list(iterable)  # start the workers
        start = time.perf_counter()
        for _ in range(3):
            for _ in iterable:
                pass
        return (time.perf_counter() - start) / (3 * len(loader)) * 1e6

    plain, watched = [], []
    for _ in range(repeats):
        plain.append(run(False))
        watched.append(run(True))
    return {"plain_us_per_batch": statistics.median(plain), "watched_us_per_batch": statistics.median(watched)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--out", default=str(RESULTS / "workers.json"))
    args = parser.parse_args()
    transport = transport_ns(args.samples, args.repeats, args.rounds)
    e2e = end_to_end_us(args.batches, max(3, args.repeats // 3))
    result = {
        "settings": vars(args),
        "transport_per_batch": transport,
        "end_to_end": e2e,
        "target_transport_under_20us": {
            "value_us": transport["total_ns"] / 1e3,
            "limit_us": 20.0,
            "met": transport["total_ns"] / 1e3 < 20.0,
        },
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for name, value in transport.items():
        print(f"{name:24} {value / 1e3:8.2f} us")
    print(
        f"end to end, 2 workers, batch of 32: {e2e['plain_us_per_batch']:.1f} us plain,"
        f" {e2e['watched_us_per_batch']:.1f} us watched, per batch"
    )
    met = result["target_transport_under_20us"]["met"]
    print(f"target: transport under 20 us per batch: {'met' if met else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

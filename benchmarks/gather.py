"""Cost of gathering every rank's summary onto rank 0 (run by hand; not a test).

For 2, 4 and 8 local ranks (gloo over a TCPStore, as torchrun sets up a job), each rank records a realistic
run (a train and a val phase; in the loader, the dataset read with its decode, a transform and collate; in
the step, h2d, forward, loss, backward, optimizer) and then gathers it onto rank 0 twenty times. Measured:
the bytes each rank sends (with and without the recent-measurement windows), the time of one gather on rank
0 (all ranks start it together after a barrier, so this is the gather itself, not a wait for a late rank),
the time it costs each other rank (it posts and goes on), and, for reference, ``dist.gather_object`` of the
same summaries. Medians over the repeats. Writes ``benchmarks/results/gather.json``.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import stepwatch
from stepwatch._gather import _encode

RESULTS = Path(__file__).resolve().parent / "results"
REPEATS = 20


def recorded() -> stepwatch.Stopwatch:
    """A run with the stages of a real image pipeline, the pipeline's read inside the loader's wait."""
    sw = stepwatch.Stopwatch()
    sw.enable()

    def batches(count: int) -> Any:
        for _ in range(count):
            for _ in range(8):
                with sw.timed("dataset"), sw.timed("decode"):
                    pass
                with sw.timed("augment"):
                    pass
            with sw.timed("collate"):
                pass
            yield None

    for phase, steps in (("train", 200), ("val", 40)):
        for _ in sw.timed_iter(batches(steps), phase=phase):
            for stage in ("h2d", "forward", "loss", "backward", "optimizer") if phase == "train" else ("forward",):
                with sw.timed(stage):
                    pass
            sw.count(samples=32)
    return sw


def one_rank(rank: int, world: int, address: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=address, rank=rank, world_size=world)
    sw = recorded()
    summary = sw.summary()
    sizes = {"without_windows": len(_encode(summary, False)), "with_windows": len(_encode(summary, True))}
    ours, posts, reference = [], [], []
    for _ in range(REPEATS):
        dist.barrier()
        start = time.perf_counter()
        gathered = stepwatch.distributed.gather(summary)
        elapsed = time.perf_counter() - start
        (ours if rank == 0 else posts).append(elapsed)
        if rank == 0:
            assert gathered is not None and len(gathered.runs) == world and not gathered.missing
        dist.barrier()
        start = time.perf_counter()
        objects: list[Any] | None = [None] * world if rank == 0 else None
        dist.gather_object(summary.to_dict(), objects, dst=0)
        reference.append(time.perf_counter() - start)
    figures = {
        "rank": rank,
        "bytes": sizes,
        "gather_s": statistics.median(ours) if ours else None,
        "post_s": statistics.median(posts) if posts else None,
        "gather_object_s": statistics.median(reference),
    }
    with open(f"{out}.{rank}", "w") as file:
        json.dump(figures, file)
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def measure(world: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "figures")
        mp.spawn(one_rank, args=(world, f"tcp://127.0.0.1:{free_port()}", out), nprocs=world)
        ranks = [json.loads(Path(f"{out}.{rank}").read_text()) for rank in range(world)]
    posts = [r["post_s"] for r in ranks if r["post_s"] is not None]
    return {
        "ranks": world,
        "bytes_per_rank": ranks[1]["bytes"],
        "gather_on_rank_0_ms": ranks[0]["gather_s"] * 1e3,
        "post_on_other_ranks_ms_median": statistics.median(posts) * 1e3,
        "gather_object_on_rank_0_ms": ranks[0]["gather_object_s"] * 1e3,
    }


def main() -> None:
    results = [measure(world) for world in (2, 4, 8)]
    for row in results:
        print(
            f"{row['ranks']} ranks: {row['bytes_per_rank']['without_windows']:,} bytes per rank"
            f" ({row['bytes_per_rank']['with_windows']:,} with windows); gather on rank 0"
            f" {row['gather_on_rank_0_ms']:.2f} ms; post on another rank {row['post_on_other_ranks_ms_median']:.2f} ms;"
            f" gather_object {row['gather_object_on_rank_0_ms']:.2f} ms"
        )
    # one more rank costs rank 0 about the slope between 2 and 8 ranks; a thousand ranks, by that line
    small, large = results[0], results[-1]
    per_rank_ms = (large["gather_on_rank_0_ms"] - small["gather_on_rank_0_ms"]) / (large["ranks"] - small["ranks"])
    extrapolated = {
        "ranks": 1000,
        "bytes_to_rank_0": large["bytes_per_rank"]["without_windows"] * 999,
        "gather_on_rank_0_s": (small["gather_on_rank_0_ms"] + per_rank_ms * (1000 - small["ranks"])) / 1e3,
        "per_extra_rank_ms": per_rank_ms,
    }
    print(
        f"1,000 ranks (linear from 2 to 8): {extrapolated['bytes_to_rank_0'] / 1e6:.1f} MB to rank 0,"
        f" about {extrapolated['gather_on_rank_0_s']:.2f} s on rank 0 ({per_rank_ms:.3f} ms per extra rank)"
    )
    RESULTS.mkdir(exist_ok=True)
    document = {
        "machine": {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count()},
        "repeats": REPEATS,
        "store": "TCPStore (tcp:// init, gloo)",
        "results": results,
        "extrapolated": extrapolated,
    }
    (RESULTS / "gather.json").write_text(json.dumps(document, indent=1) + "\n")
    print(f"written to {RESULTS / 'gather.json'}", file=sys.stderr)


if __name__ == "__main__":
    main()

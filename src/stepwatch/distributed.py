"""Many ranks: which rank of a ``torch.distributed`` job this process is, its own run file, and the gather.

The public face of three modules: ``_job`` (who this process is in its job, and where its run file goes),
``_gather`` (every rank's summary brought to rank 0 through the job's store, with a deadline) and
``_all_ranks`` (:class:`AllRanks`, the ranks of a job as one value). See each for how it works.
"""

from __future__ import annotations

from ._all_ranks import AllRanks, combine_jobs
from ._gather import GATHER_TIMEOUT, MAX_GATHER_TIMEOUT, gather, gather_timeout
from ._job import RANK_FIELD, all_ranks_path, in_job, is_rank_zero, rank_info, rank_path

__all__ = [
    "GATHER_TIMEOUT",
    "MAX_GATHER_TIMEOUT",
    "RANK_FIELD",
    "AllRanks",
    "all_ranks_path",
    "combine_jobs",
    "gather",
    "gather_timeout",
    "in_job",
    "is_rank_zero",
    "rank_info",
    "rank_path",
]

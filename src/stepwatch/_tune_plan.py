"""The tuning's decisions, apart from running anything: which setting to try next (``plan``, a generator sent
each trial), when one beats another beyond the noise (``better``, ``preferred``) and the last word on the runs
pooled (``conclude``). ``_tune`` runs the trials they ask for; ``tests/test_tune_decisions.py`` drives them with
trials of known times.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import replace

from ._dataloader.find import cores
from ._tuning import Setting, Trial, Tuning

CONFIRMATIONS = 3
"""Rounds of confirmation at most: a setting that its confirmation leaves behind another is confirmed in turn."""
PREFETCH = (4, 8)
"""``prefetch_factor`` values tried beside torch's default (2), for the best number of workers."""


def better(candidate: Trial, best: Trial) -> bool:
    """Faster by more than the noise of either (and by more than a nanosecond: equal times pooled differently
    differ in their last bits)."""
    return best.per_step - candidate.per_step > max(candidate.noise, best.noise, 1e-9)


def preferred(candidate: Trial, incumbent: Trial) -> bool:
    """Faster per step beyond the noise; or, for the same setting with persistent workers, starting an epoch
    faster: persistence changes nothing within an epoch (the same worker loop; a tuning's figures pool the two
    settings' steps), so a difference in their steps is chance."""
    if candidate.setting == replace(incumbent.setting, persistent_workers=True) != incumbent.setting:
        return candidate.epoch_start_s < incumbent.epoch_start_s
    return better(candidate, incumbent)


def plan(
    original: Setting, max_workers: int | None = None, pin_memory: bool | None = None, map_style: bool = True
) -> Generator[Setting, Trial, Setting]:
    """The search, as a generator: it yields the next setting to try and is sent its trial; it returns the
    setting chosen. ``num_workers`` is climbed from 0 (for a ``map_style`` dataset: an IterableDataset shards
    itself across its workers) until two settings in a row gain nothing beyond the noise (past the CPU count, up
    to twice the cores, while the best workers leave the loop waiting and are themselves seen waiting rather
    than computing), then ``prefetch_factor`` is tried for the best, then, with an accelerator in use
    (``pin_memory``: the program's own pinning), the other pinning, then persistent workers (chosen when an
    epoch starts faster with them; for a ``map_style`` dataset, whose epoch a trial can end); then the original
    and the best are run once more, and where the setting ``conclude`` will recommend (another best, or the
    original where the best's runs did not beat it) has a persistent variant not run yet, that is run too: its
    steps pool with the choice's, and a setting they leave faster beyond the noise is confirmed in turn."""
    cpus = cores() or 1
    limit = max_workers if max_workers is not None else cpus
    best = yield original
    history = [best]
    tried = {original}
    workers, misses, extended = -1, 0, max_workers is not None
    while map_style and misses < 2:
        workers = _next_workers(workers)
        if workers > limit:
            if extended or best.setting.num_workers != limit or not _waiting(best):
                break
            limit, extended = 2 * cpus + 2, True  # the best workers still leave the loop waiting: more than cores
        setting = Setting(workers)
        if setting in tried:
            continue
        tried.add(setting)
        trial = yield setting
        history.append(trial)
        if better(trial, best):
            best, misses = trial, 0
        elif workers > best.setting.num_workers:  # fewer workers than the best so far: no step past it
            misses += 1
    if best.setting.num_workers:
        for factor in PREFETCH:
            setting = Setting(best.setting.num_workers, factor)
            if setting not in tried:
                tried.add(setting)
                trial = yield setting
                history.append(trial)
                if better(trial, best):
                    best = trial
    if pin_memory is not None:
        setting = replace(best.setting, pin_memory=not pin_memory)
        trial = yield setting
        history.append(trial)
        if better(trial, best):
            best = trial
    if map_style and best.setting.num_workers and not best.setting.persistent_workers:
        setting = replace(best.setting, persistent_workers=True)
        if setting not in tried:
            trial = yield setting
            history.append(trial)
            if preferred(trial, best):
                best = trial
    confirmed, rounds = False, 0
    while True:
        pool = Tuning(original, best.setting, tuple(history))
        beating = _beating(pool)
        if rounds < CONFIRMATIONS and beating is not None:
            best = beating  # pooled, faster than the choice beyond the noise: the one to confirm now
        elif confirmed:
            kept_workers = _persistent_variant(pool, best.setting, map_style)
            if kept_workers is None:
                break
            history.append((yield kept_workers))  # its steps pool with the choice's: the choice is weighed again
            continue
        history.append((yield original))  # confirm: the original and the best once more
        if best.setting != original:
            history.append((yield best.setting))  # the best's figure is this run of its own
        confirmed, rounds = True, rounds + 1
    return best.setting


def conclude(original: Setting, chosen: Setting, trials: list[Trial], kept: list[str], loader: str = "") -> Tuning:
    """The tuning: the search's choice, unless its runs pooled (its confirming run among them) do not beat the
    original's beyond the noise; its persistent variant instead when that starts an epoch faster."""
    confirming = Tuning(original, chosen, tuple(trials), tuple(kept), loader)
    chosen = _confirmed(confirming, chosen)
    kept_workers = replace(chosen, persistent_workers=True)
    pooled = confirming.of
    if kept_workers != chosen and confirming.runs(kept_workers) and preferred(pooled(kept_workers), pooled(chosen)):
        chosen = kept_workers  # the same steps, an epoch started faster
    return Tuning(original, chosen, tuple(trials), tuple(kept), loader)


def _confirmed(pool: Tuning, chosen: Setting) -> Setting:
    """``chosen``, or the original where its runs pooled (its confirming run among them) do not beat the
    original's beyond the noise."""
    original = pool.original
    return chosen if chosen == original or preferred(pool.of(chosen), pool.of(original)) else original


def _beating(pool: Tuning) -> Trial | None:
    """The fastest of the settings whose runs, pooled, are faster than the pool's best beyond the noise, or None.
    Not merely the fastest setting: a lucky run read fast with a wide noise must not hide a steadier setting that
    does beat the choice."""
    choice = pool.of(pool.best)
    beating = [
        trial
        for trial in (pool.of(setting) for setting in dict.fromkeys(t.setting for t in pool.trials))
        if trial.setting != pool.best and better(trial, choice)
    ]
    return min(beating, key=lambda trial: trial.per_step, default=None)


def _persistent_variant(pool: Tuning, best: Setting, map_style: bool) -> Setting | None:
    """The persistent variant of what ``conclude`` will recommend (:func:`_confirmed`), when there is one and it
    has not run yet: its epoch start is what it adds, and its steps, pooled with its twin's, weigh the choice
    again."""
    final = _confirmed(pool, best)
    if not map_style or not final.num_workers or final.persistent_workers:
        return None
    kept_workers = replace(final, persistent_workers=True)
    return None if pool.runs(kept_workers) else kept_workers


def _next_workers(workers: int) -> int:
    """0, 1, 2, 3, 4, 6, 9, 13, ...: one by one up to 4, then by half again."""
    return workers + 1 if workers < 4 else workers + workers // 2


def _waiting(trial: Trial) -> bool:
    """Whether the loop still waits for data with that many workers while they wait rather than compute (on
    reads: busy under half their time; a worker that computes while the loop waits is on a CPU nearly always)."""
    return trial.wait_share > 0.05 and (trial.workers_busy is None or trial.workers_busy < 0.5)

"""The tuning's decisions, driven with trials of known times: the search (``plan``), the last word on the runs
pooled (``conclude``) and the drift between runs of one setting, which the best's figure carries."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from stepwatch._tune_plan import conclude, plan
from stepwatch._tuning import Setting, Trial, Tuning


def trial(setting: Setting, ms: float, epoch_start_s: float = 0.01, spread_ms: float = 0.0) -> Trial:
    """Ten steps of ``ms`` (alternating ``± spread_ms``), no wait."""
    steps = tuple((ms + (spread_ms if i % 2 else -spread_ms)) / 1e3 for i in range(10))
    return Trial(setting, steps, (0.0,) * 10, epoch_start_s)


def search(
    original: Setting, timing: Callable[[Setting], tuple[float, float, float]]
) -> tuple[list[Setting], list[Trial], Setting]:
    """``plan`` from ``original`` (at most 2 workers) driven to its end, each setting's trial made by ``timing``
    (ms per step, epoch start s, spread ms): the settings asked, the trials and the setting chosen."""
    steps = plan(original, max_workers=2)
    asked, trials = [next(steps)], []
    while True:
        trials.append(trial(asked[-1], *timing(asked[-1])))
        try:
            asked.append(steps.send(trials[-1]))
        except StopIteration as done:
            return asked, trials, done.value


def test_with_an_accelerator_the_other_pinning_is_tried_for_the_best() -> None:
    """The search itself (``plan``), driven with trials of known times: workers help up to 2, prefetching does
    not, and pinning (tried only with an accelerator in use) does."""
    times = {0: 30.0, 1: 16.0, 2: 9.0}
    search = plan(Setting(0), max_workers=2, pin_memory=False)
    asked = [next(search)]
    chosen = None
    while chosen is None:
        setting = asked[-1]
        ms = times.get(setting.num_workers, 9.0)
        if setting.pin_memory:
            ms = 7.0
        try:
            asked.append(search.send(trial(setting, ms)))
        except StopIteration as done:
            chosen = done.value
    assert asked == [
        Setting(0),
        Setting(1),
        Setting(2),
        Setting(2, 4),
        Setting(2, 8),
        Setting(2, None, True),
        Setting(2, None, True, True),  # persistent workers: not chosen, an epoch starts no faster with them
        Setting(0),
        Setting(2, None, True),
    ]
    assert chosen == Setting(2, None, True) and chosen.describe() == "num_workers=2, pin_memory=True"


def test_settings_below_the_programs_own_do_not_stop_the_climb() -> None:
    """From ``num_workers=2``, 0 and 1 are slower: they are no step past the best, so the climb goes on to 3 (the
    fastest) and stops two settings after it."""
    times = {0: 30.0, 1: 20.0, 2: 10.0, 3: 6.0}
    search = plan(Setting(2), max_workers=6)
    asked = [next(search)]
    while True:
        setting = asked[-1]
        ms = times.get(setting.num_workers, 6.0)
        try:
            asked.append(search.send(trial(setting, ms)))
        except StopIteration as done:
            chosen = done.value
            break
    assert [setting.num_workers for setting in asked[:6]] == [2, 0, 1, 3, 4, 6]
    assert chosen == Setting(3)


def test_a_setting_and_its_persistent_variant_share_their_steps_and_differ_in_their_epoch_start() -> None:
    """Persistence changes nothing within an epoch: a setting's figures pool its steps with its persistent
    variant's (both rows show the same time per step), and the variant is recommended when it starts an epoch
    faster, whatever its one run read (4.95 or 6.0 ms against 4.6 and 4.95); not when it starts no faster."""
    original, persistent = Setting(2), Setting(2, persistent_workers=True)
    trials = [
        trial(original, 4.6, 0.3, 0.1),
        trial(Setting(0), 12.0, 0.01, 0.1),
        trial(persistent, 4.95, 0.01, 0.1),
        trial(original, 4.95, 0.3, 0.1),
    ]
    assert conclude(original, original, trials, []).best == persistent
    slower = [*trials[:2], trial(persistent, 6.0, 0.01, 0.1), trials[3]]
    tuning = conclude(original, original, slower, [])
    assert tuning.best == persistent
    assert tuning.of(original).per_step == tuning.of(persistent).per_step == pytest.approx((4.6 + 6.0 + 4.95) / 3e3)
    assert tuning.of(original).epoch_start_s == 0.3 and tuning.of(persistent).epoch_start_s == 0.01
    twins = Tuning(original, original, (trials[0], trial(persistent, 5.3, 0.01, 0.0)))
    assert twins.drift() == pytest.approx(0.7 / 2 / 4.95 * 2**0.5, rel=0.01)  # the twins' runs: one setting run twice
    late = [*trials[:2], trial(persistent, 4.95, 0.3, 0.1), trials[3]]
    assert conclude(original, original, late, []).best == original  # no faster to start: nothing to gain


def test_the_persistent_variant_is_not_turned_down_for_a_run_that_read_slower_than_another_setting() -> None:
    """CI's case (workers that take 300 ms to start, reads that barely keep up with the step): the original's
    runs read 4.70 and 5.14 ms, prefetch 4 4.86 ms, and the persistent variant's one run 5.23 ms, slower than
    prefetch 4 beyond both their noises: it had been turned down, although it times the original's own steps.
    Its figures are its twin's: it is the recommendation (an epoch starts in 12 ms instead of 361)."""
    original, persistent, four = Setting(2), Setting(2, persistent_workers=True), Setting(2, 4)
    trials = [
        trial(original, 4.70, 0.36, 0.3),
        trial(Setting(0), 12.74, 0.009, 0.1),
        trial(Setting(1), 9.20, 0.34, 0.5),
        trial(four, 4.86, 0.34, 0.4),
        trial(Setting(2, 8), 4.84, 0.34, 0.4),
        trial(persistent, 5.23, 0.012, 0.3),
        trial(original, 5.14, 0.36, 0.3),
    ]
    tuning = conclude(original, four, trials, [])
    alone, fours = tuning.runs(persistent)[0], tuning.of(four)
    assert alone.per_step - fours.per_step > max(alone.noise, fours.noise)  # the comparison that turned it down
    assert tuning.best == persistent, tuning.render()
    assert tuning.of(persistent).per_step == tuning.of(original).per_step == pytest.approx((4.70 + 5.23 + 5.14) / 3e3)


def test_the_best_figure_carries_the_drift_seen_between_runs_of_one_setting() -> None:
    """The original ran at 10 and 11 ms and the best at 5 and 5.5 ms, each run without noise of its own: runs
    drift by about 7% of the mean (the standard deviation of two runs differing by 10% is 7%), and the best's
    figure, one run, says so in its noise."""
    original, best = Setting(0), Setting(2)
    tuning = Tuning(original, best, (trial(original, 10), trial(best, 5), trial(original, 11), trial(best, 5.5)))
    drift = tuning.drift()
    assert drift == pytest.approx(0.0674, rel=0.01)  # sqrt(((0.5/10.5)**2 * 2 + (0.25/5.25)**2 * 2) / 2)
    figure = tuning.measured(best)
    assert figure.per_step == pytest.approx(0.0055) and figure.noise == pytest.approx(2 * drift * 0.0055)
    pooled = tuning.measured(original)  # its runs pooled: the drift is in their spread already
    assert pooled.drift == 0 and pooled.noise == pytest.approx(2 * pooled.spread / 20**0.5)
    alone = Tuning(original, best, (trial(original, 10), trial(best, 5)))
    assert alone.drift() == 0 and alone.measured(best).noise == 0  # nothing ran twice: no drift to see


def test_when_the_confirmations_choose_another_setting_its_persistent_variant_is_tried_too() -> None:
    """CI's case (workers that take 300 ms to start): the persistent variant of the program's own setting was
    preferred (it starts an epoch at once), then the runs pooled made prefetch 8 the best; its own persistent
    variant is run after the confirmations, and recommended: as fast, and starting an epoch at once."""

    def timing(setting: Setting) -> tuple[float, float, float]:
        """ms per step, epoch start s, spread ms: prefetch 8 fastest, the original's first run too noisy to tell."""
        start = 0.015 if setting.persistent_workers else 0.4
        if setting.num_workers < 2:
            return 14.0, start, 0.5
        if setting.prefetch_factor:
            return (5.5, start, 1.0) if setting.prefetch_factor == 8 else (7.6, start, 4.0)
        return (8.4, start, 0.2) if setting.persistent_workers else (8.0, start, 5.0)

    original = Setting(2)
    asked, trials, chosen = search(original, timing)
    eight = Setting(2, 8)
    assert asked[5:] == [Setting(2, persistent_workers=True), original, eight, replace(eight, persistent_workers=True)]
    assert chosen == eight
    assert conclude(original, chosen, trials, []).best == replace(eight, persistent_workers=True)


def test_when_the_original_stays_its_persistent_variant_is_tried_after_the_confirmations() -> None:
    """CI's other case: prefetch 8 beat the original's first run, its persistent variant was preferred, and the
    confirmations left it no faster than the original pooled: ``conclude`` keeps the original, so the original's
    own persistent variant is run last, and recommended (as fast, starting an epoch at once)."""
    runs: dict[Setting, int] = {}

    def timing(setting: Setting) -> tuple[float, float, float]:
        """ms per step, epoch start s, spread ms: all as fast with 2 workers, the original's first run slow."""
        runs[setting] = runs.get(setting, 0) + 1
        start = 0.015 if setting.persistent_workers else 0.4
        if setting.num_workers < 2:
            return 12.0, start, 0.1
        if setting == Setting(2):
            return (5.6 if runs[setting] == 1 else 4.2), start, 0.2
        return (5.5, start, 1.0) if setting.prefetch_factor == 4 else (4.9, start, 0.1)

    original = Setting(2)
    asked, trials, chosen = search(original, timing)
    kept = Setting(2, persistent_workers=True)
    assert asked[4:] == [Setting(2, 8), Setting(2, 8, None, True), original, Setting(2, 8, None, True), kept]
    assert conclude(original, chosen, trials, []).best == kept


def test_a_choice_whose_persistent_twin_reads_slower_gives_way_to_a_setting_faster_beyond_the_noise() -> None:
    """Prefetch 4 read 5.0 ms once and its persistent twin 7.6 ms twice: the same steps, pooled, 6.7 ms, so
    2 workers at 5.7 ms are faster beyond the noise; they are confirmed in turn, their own persistent variant
    run, and recommended (it starts an epoch faster). Taken apart, the one lucky run of prefetch 4 had been the
    recommendation."""
    runs: dict[Setting, int] = {}

    def timing(setting: Setting) -> tuple[float, float, float]:
        runs[setting] = runs.get(setting, 0) + 1
        start = 0.015 if setting.persistent_workers else 0.04
        if setting.num_workers < 2:
            return (8.2, start, 0.05) if setting.num_workers == 0 else (7.0, start, 0.3)
        if setting.prefetch_factor == 4:
            return (7.6 if setting.persistent_workers else 5.0), start, 0.1
        return 5.7, start, 0.1

    original, four, two = Setting(0), Setting(2, 4), Setting(2)
    asked, trials, chosen = search(original, timing)
    persistent_four = replace(four, persistent_workers=True)
    assert asked[5:] == [
        persistent_four,
        original,
        persistent_four,
        original,
        two,
        replace(two, persistent_workers=True),
    ]
    assert chosen == two
    tuning = conclude(original, chosen, trials, [])
    assert tuning.best == replace(two, persistent_workers=True)
    assert tuning.of(four).per_step == pytest.approx((5.0 + 7.6 * 2) / 3e3)


def test_a_lucky_setting_with_a_wide_noise_does_not_hide_a_steady_one_that_beats_the_choice() -> None:
    """A loaded machine's case: 1 worker read 7.9 ms once and 9.3 after, 2 workers a steady 7.8 ms (not faster
    than that first run beyond the noise), prefetch 4 a lucky 6.0 ms with a noise of 4 ms. The fastest setting
    does not beat the choice (1 worker) beyond its noise, but 2 workers do: they are confirmed and recommended,
    and nothing measured is faster than the recommendation beyond the noise. Looking at the fastest alone, the
    tuning recommended 1 worker at 8.6 ms against 2 workers' 7.8 ± 0.1."""
    runs: dict[Setting, int] = {}

    def timing(setting: Setting) -> tuple[float, float, float]:
        runs[setting] = runs.get(setting, 0) + 1
        start = 0.006 if setting.persistent_workers else 0.04
        if setting.num_workers == 0:
            return 14.8, start, 0.3
        if setting.prefetch_factor:
            return (6.0, start, 6.0) if setting.prefetch_factor == 4 else (14.2, start, 7.0)
        if setting.num_workers == 1:
            return (7.9 if runs[setting] == 1 and not setting.persistent_workers else 9.3), start, 0.2
        return 7.8, start, 0.3

    original, one, two = Setting(0), Setting(1), Setting(2)
    asked, trials, chosen = search(original, timing)
    assert asked[5:] == [replace(one, persistent_workers=True), original, two, replace(two, persistent_workers=True)]
    assert chosen == two
    tuning = conclude(original, chosen, trials, [])
    assert tuning.best == replace(two, persistent_workers=True)
    best = tuning.of(tuning.best)
    for setting in {trial.setting for trial in trials}:
        other = tuning.of(setting)
        assert best.per_step <= other.per_step + max(best.noise, other.noise), setting

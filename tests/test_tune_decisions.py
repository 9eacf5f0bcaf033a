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


def test_the_persistent_variant_of_the_choice_is_weighed_again_on_the_runs_pooled() -> None:
    """The search kept the original (its persistent variant's one run read slower than the original's first run
    beyond the noise); pooled with the original's confirmation, the two are within each other's noise and the
    persistent one starts an epoch in 10 ms instead of 300: it is the recommendation."""
    original, persistent = Setting(2), Setting(2, persistent_workers=True)
    trials = [
        trial(original, 4.6, 0.3, 0.1),
        trial(Setting(0), 12.0, 0.01, 0.1),
        trial(persistent, 4.95, 0.01, 0.1),
        trial(original, 4.95, 0.3, 0.1),
    ]
    assert conclude(original, original, trials, []).best == persistent
    slower = [*trials[:2], trial(persistent, 6.0, 0.01, 0.1), trials[3]]
    assert conclude(original, original, slower, []).best == original  # slower beyond the noise: not chosen


def test_the_persistent_variant_is_not_chosen_when_another_setting_beats_it_beyond_the_noise() -> None:
    """CI's case: the choice (prefetch 8, 4.87 ± 0.3 ms) and its persistent variant (5.0 ms) are within each
    other's noise, but prefetch 4 ran at 4.8 ms with little noise: faster than the persistent one beyond the
    noise, so switching to it would recommend a setting slower than one measured. The choice stays."""
    original, four, eight = Setting(0), Setting(1, 4), Setting(1, 8)
    persistent = replace(eight, persistent_workers=True)
    trials = [
        trial(original, 8.0, 0.004),
        trial(four, 4.8, 0.034, 0.02),
        trial(eight, 4.87, 0.032, 0.4),
        trial(persistent, 5.0, 0.016, 0.1),
        trial(original, 8.0, 0.004),
        trial(eight, 4.87, 0.032, 0.4),
    ]
    assert conclude(original, eight, trials, []).best == eight
    close = [*trials[:3], trial(persistent, 4.82, 0.016, 0.1), *trials[4:]]
    assert conclude(original, eight, close, []).best == persistent  # within everyone's noise: it starts faster


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

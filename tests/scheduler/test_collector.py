"""The scheduler process's collector setting (`luftpause.scheduler.collector`)."""

from __future__ import annotations

import gc

from luftpause.scheduler import collector


def test_tune_sets_the_thresholds_and_freezes_what_exists() -> None:
    before = gc.get_threshold()
    try:
        collector.tune()
        assert gc.get_threshold() == collector.THRESHOLDS
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)

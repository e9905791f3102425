"""A run's books: what the launcher counts when it ends a run whose runner died."""

from __future__ import annotations

import pytest

from runctl.bus import Bus
from runctl.events import TrialFinished, new_event
from services.launcher.carry.books import Books
from services.launcher.ledger import Ledger

pytestmark = pytest.mark.integration


async def test_the_trials_on_the_bus_are_counted_when_the_saved_count_lags(bus: Bus) -> None:
    # A runner killed between publishing a trial and saving its progress saved one too few: the bus has them all.
    books = Books(bus, await Ledger.open(bus), "/runctl/launcher")
    assert await books.published_trials("nlp", "r-1", known=0) == 0
    for k in range(3):
        trial = TrialFinished(task="t", trial=k, reward=1.0, termination_reason="agent_completed")
        event = new_event(trial, team="nlp", run_id="r-1", source="/runctl/runner", event_id=f"r-1.trial.t.{k}")
        await bus.publish(event)
        await bus.publish(event)  # a resumed runner publishing it again: one trial still
    other = TrialFinished(task="t", trial=0, reward=0.0, termination_reason="agent_completed")
    await bus.publish(new_event(other, team="nlp", run_id="r-2", source="/runctl/runner", event_id="r-2.trial.t.0"))
    assert await books.published_trials("nlp", "r-1", known=2) == 3
    assert await books.published_trials("nlp", "r-1", known=5) == 5  # never fewer than were saved

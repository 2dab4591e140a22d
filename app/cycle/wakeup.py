"""The scheduler's timed cycles: one at the soonest time a waiting job's begin time or
off-peak window comes (`app.scheduling.wakeup`), instead of the next beat."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

# Celery holds a timed (eta) task in the worker until it is due; Redis gives a message
# unacknowledged for its visibility timeout (300 s) to another worker. Times further
# ahead are armed by a later cycle, once they are this close.
HORIZON = timedelta(seconds=60)


@dataclass
class WakeUps:
    """Which timed cycle is armed, so that each cycle does not send another."""

    armed: datetime | None = None

    def arm(self, wake_at: datetime | None, *, now: datetime) -> bool:
        """True when a cycle should be sent for `wake_at` (now remembered as armed): it
        is within the horizon and sooner than the one armed, or that one has fired."""
        if wake_at is None or wake_at - now > HORIZON:
            return False
        if self.armed is not None and now < self.armed <= wake_at:
            return False
        self.armed = wake_at
        return True

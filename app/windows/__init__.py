"""Off-peak windows, job begin times and time-of-use energy cost (pure helpers).

``calendar``: window definitions and DST-correct occurrence arithmetic;
``schemas``: pydantic REST bodies; ``tariff``: prices and energy integration.
"""

from app.windows.calendar import (
    BeginMode,
    DailyRange,
    Interval,
    UpcomingWindow,
    WindowSpec,
    fits_in_window,
    next_opening,
    occurrences,
    open_interval_at,
    open_intervals_at,
    resolve_local,
    schedule_ready,
    upcoming,
    validate_cron,
    validate_timezone,
)
from app.windows.tariff import (
    EnergyCost,
    Tariff,
    TariffRule,
    cost_of_energy,
    energy_wh,
    price_at,
)

__all__ = [
    "BeginMode",
    "DailyRange",
    "EnergyCost",
    "Interval",
    "Tariff",
    "TariffRule",
    "UpcomingWindow",
    "WindowSpec",
    "cost_of_energy",
    "energy_wh",
    "fits_in_window",
    "next_opening",
    "occurrences",
    "open_interval_at",
    "open_intervals_at",
    "price_at",
    "resolve_local",
    "schedule_ready",
    "upcoming",
    "validate_cron",
    "validate_timezone",
]

"""Time-of-use electricity tariff and energy accounting (pure).

A tariff has a zone, a default price per kWh and ordered rules
``{"days": [...], "start": "HH:MM", "end": "HH:MM", "price_per_kwh": x}``.
Rules are matched on the *local wall clock* of the tariff's zone; the first
matching rule wins, otherwise the default price applies. ``end`` before
``start`` crosses midnight and the ``days`` name the weekday on which the rule
*starts* (so ``fri 22:00-06:00`` covers Saturday 00:00-06:00 too). ``days``
omitted = every day. ``end == start`` is rejected (use the default price for
"all day").

Energy is integrated from ``(timestamp, power_w)`` samples with the trapezoid
rule between consecutive samples (sorted by time). A pair of samples further
apart than ``max_gap_s`` is **not** integrated: the collector was probably down
and guessing the power over the gap would invent energy; such gaps are counted
in :attr:`EnergyCost.skipped_s`. Each integrated segment is split at the
tariff's price boundaries (power interpolated linearly), so a segment spanning
a price change is charged exactly.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

from app.config import Settings, SettingsError
from app.windows.calendar import (
    ALL_DAYS,
    WEEKDAYS,
    Weekday,
    parse_days,
    parse_hhmm,
    resolve_local,
    validate_timezone,
)

Sample = tuple[datetime, float]

#: default for ``max_gap_s``: samples more than 5 minutes apart are not integrated.
DEFAULT_MAX_GAP_S = 300.0


@dataclass(frozen=True)
class TariffRule:
    start: time
    end: time
    price_per_kwh: float
    days: frozenset[Weekday] = ALL_DAYS

    def __post_init__(self) -> None:
        if self.start == self.end:
            raise ValueError("tariff rule end must differ from start")
        if self.price_per_kwh < 0:
            raise ValueError("price_per_kwh must be >= 0")
        if not self.days or not self.days <= ALL_DAYS:
            raise ValueError("days must be a non-empty subset of mon..sun")

    def applies(self, local: datetime) -> bool:
        """Does the rule cover this naive/aware *local* wall time?"""
        t = local.time().replace(tzinfo=None)
        today = WEEKDAYS[local.weekday()]
        if self.start < self.end:
            return today in self.days and self.start <= t < self.end
        # crosses midnight: evening part belongs to today, morning part to yesterday
        yesterday = WEEKDAYS[(local.weekday() - 1) % 7]
        return (today in self.days and t >= self.start) or (yesterday in self.days and t < self.end)


@dataclass(frozen=True)
class Tariff:
    timezone: str
    default_price_per_kwh: float
    rules: tuple[TariffRule, ...] = ()

    def __post_init__(self) -> None:
        validate_timezone(self.timezone)
        if self.default_price_per_kwh < 0:
            raise ValueError("default_price_per_kwh must be >= 0")

    @property
    def max_price_per_kwh(self) -> float:
        return max([self.default_price_per_kwh, *(r.price_per_kwh for r in self.rules)])

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Tariff:
        """Build from ``{"timezone", "default_price_per_kwh", "rules": [...]}``."""
        rules = tuple(
            TariffRule(
                start=parse_hhmm(r["start"]),
                end=parse_hhmm(r["end"]),
                price_per_kwh=float(r["price_per_kwh"]),
                days=parse_days(r.get("days")),
            )
            for r in data.get("rules", ())
        )
        return cls(
            timezone=str(data["timezone"]),
            default_price_per_kwh=float(data["default_price_per_kwh"]),
            rules=rules,
        )


@dataclass(frozen=True)
class EnergyCost:
    energy_wh: float
    cost: float
    cost_at_peak: float
    skipped_s: float = 0.0


def _aware(at: datetime, what: str) -> datetime:
    if at.tzinfo is None or at.tzinfo.utcoffset(at) is None:
        raise ValueError(f"{what} must be timezone-aware")
    return at.astimezone(UTC)


def price_at(tariff: Tariff, at: datetime) -> float:
    """Price per kWh in force at ``at`` (aware)."""
    local = _aware(at, "at").astimezone(validate_timezone(tariff.timezone))
    for rule in tariff.rules:
        if rule.applies(local):
            return rule.price_per_kwh
    return tariff.default_price_per_kwh


def _prepared(samples: Iterable[Sample]) -> list[tuple[datetime, float]]:
    out: list[tuple[datetime, float]] = []
    for ts, power in samples:
        p = float(power)
        if math.isnan(p) or p < 0:
            raise ValueError(f"power_w must be a non-negative number, got {power!r}")
        out.append((_aware(ts, "sample timestamp"), p))
    out.sort(key=lambda s: s[0])
    return out


def _segments(
    samples: Iterable[Sample], max_gap_s: float
) -> tuple[list[tuple[datetime, float, datetime, float]], float]:
    pts = _prepared(samples)
    segs: list[tuple[datetime, float, datetime, float]] = []
    skipped = 0.0
    for (t0, p0), (t1, p1) in pairwise(pts):
        dt = (t1 - t0).total_seconds()
        if dt <= 0:
            continue
        if dt > max_gap_s:
            skipped += dt
            continue
        segs.append((t0, p0, t1, p1))
    return segs, skipped


def energy_wh(samples: Iterable[Sample], max_gap_s: float = DEFAULT_MAX_GAP_S) -> float:
    """Trapezoid-rule energy in Wh; pairs further apart than ``max_gap_s`` are skipped."""
    segs, _ = _segments(samples, max_gap_s)
    return sum((p0 + p1) / 2 * (t1 - t0).total_seconds() for t0, p0, t1, p1 in segs) / 3600.0


def _boundaries(tariff: Tariff, t0: datetime, t1: datetime) -> list[datetime]:
    """UTC instants strictly inside (t0, t1) where the price may change."""
    if not tariff.rules:
        return []
    zone = validate_timezone(tariff.timezone)
    d: date = t0.astimezone(zone).date() - timedelta(days=1)
    last = t1.astimezone(zone).date() + timedelta(days=1)
    walls = {r.start for r in tariff.rules} | {r.end for r in tariff.rules}
    out: set[datetime] = set()
    while d <= last:
        for w in walls:
            naive = datetime.combine(d, w)
            # both readings of an ambiguous wall time; harmless extras otherwise
            for cand in (
                resolve_local(naive, zone),
                naive.replace(tzinfo=zone, fold=1),
            ):
                u = cand.astimezone(UTC)
                if t0 < u < t1:
                    out.add(u)
        d += timedelta(days=1)
    return sorted(out)


def cost_of_energy(
    tariff: Tariff, samples: Sequence[Sample], max_gap_s: float = DEFAULT_MAX_GAP_S
) -> EnergyCost:
    """Energy (Wh), its cost under ``tariff`` and the cost at the tariff's highest price.

    Cost is in the tariff's currency: ``kWh * price_per_kwh``, with each segment
    split at price boundaries and each piece priced at its midpoint.
    """
    segs, skipped = _segments(samples, max_gap_s)
    total_wh = 0.0
    cost = 0.0
    for t0, p0, t1, p1 in segs:
        span = (t1 - t0).total_seconds()
        cuts = [t0, *_boundaries(tariff, t0, t1), t1]
        for a, b in pairwise(cuts):
            pa = p0 + (p1 - p0) * (a - t0).total_seconds() / span
            pb = p0 + (p1 - p0) * (b - t0).total_seconds() / span
            wh = (pa + pb) / 2 * (b - a).total_seconds() / 3600.0
            total_wh += wh
            cost += wh / 1000.0 * price_at(tariff, a + (b - a) / 2)
    return EnergyCost(
        energy_wh=total_wh,
        cost=cost,
        cost_at_peak=total_wh / 1000.0 * tariff.max_price_per_kwh,
        skipped_s=skipped,
    )


def load_tariff(path: Path) -> Tariff:
    """{"timezone", "default_price_per_kwh", "rules": [{"days", "start", "end", "price_per_kwh"}]}"""
    try:
        return Tariff.from_dict(json.loads(path.read_text()))
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path} is not a valid tariff: {exc}") from None


def tariff_setting(settings: Settings) -> Tariff | None:
    """The tariff GPUSCHED_TARIFF_FILE names, or None; an unusable file is a settings error
    (the CLI checks it before it starts anything)."""
    if settings.tariff_file is None:
        return None
    try:
        return load_tariff(settings.tariff_file)
    except ValueError as exc:
        raise SettingsError(f"GPUSCHED_TARIFF_FILE: {exc}") from None

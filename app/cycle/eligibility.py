"""Which pending jobs a cycle may consider, as database conditions; and phase 0's third
step: the jobs that wait for the clock alone get their reasons without the planner.

As Slurm keeps jobs that are not yet eligible (begin time, dependency, hold) out of its
scheduling passes, and its queue depth counts eligible jobs only: a user's 100,000 tasks
that begin tomorrow must not fill the snapshot's read while GPUs stand idle for a job
that could run now. Held jobs and jobs waiting on their dependencies have their own
column and reason (app/jobs, app/cycle/dependencies.py); a begin time ahead and a closed
off-peak window are judged here by comparing columns with `now` and the window openings,
in the WHERE clause, so the database leaves those jobs out (ix_job_pending_gate).

Their reasons are the pure core's own (the same filter functions write the same text),
written in bulk. Not ranked, they carry no queue position. When the clock lets one in
again it becomes new to the queue (NEW), so the next quick cycle reads it at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import ColumnElement, and_, exists, false, or_, select, update
from sqlalchemy.orm import Session

from app.jobs.models import PENDING_MESSAGE_CHARS, Job
from app.jobs.states import JobStatus
from app.scheduling.filters import begin_time, offpeak_window
from app.scheduling.status import Context
from app.scheduling.types import JobView, PolicySettings, ReasonKind, WindowInterval

# Pending jobs a cycle may consider: held jobs (gpusched hold) and jobs whose dependencies
# have not all ended as asked are left out, so no cycle ranks, places or explains them.
ELIGIBLE = (
    Job.status == JobStatus.PENDING,
    Job.held_by.is_(None),
    Job.dependencies_met.is_(True),
)
# Array tasks over their array's limit (app/cycle/arrays.py) are left out too; they keep
# that reason, which no gate below overwrites. So are off-peak jobs no opening of their
# window is long enough for (app/jobs/never_in_window.py).
NOT_THROTTLED = and_(
    Job.pending_reason.is_distinct_from(ReasonKind.ARRAY_LIMIT.value),
    Job.pending_reason.is_distinct_from(ReasonKind.NEVER_IN_WINDOW.value),
)

BEGIN_TIME = ReasonKind.BEGIN_TIME.value
WINDOW_CLOSED = ReasonKind.WINDOW_CLOSED.value


@dataclass(frozen=True, slots=True)
class ClockGates:
    """What keeps jobs from running now by the clock alone.

    `windows`: the off-peak window openings around `now` (None: not known, off-peak jobs
    are not gated). `outside_fraction`: the policy's share of GPUs preemptible off-peak
    jobs may use outside their windows; with any, those jobs are the planner's to judge.
    """

    now: datetime
    windows: tuple[WindowInterval, ...] | None = None
    outside_fraction: float = 0.0

    @property
    def open_windows(self) -> frozenset[str]:
        return frozenset(w.name for w in self.windows or () if w.opens_at <= self.now < w.closes_at)

    def begin_ahead(self) -> ColumnElement[bool]:
        return and_(Job.schedule_mode == "at", Job.begin_at > self.now)

    def _window_gated(self) -> ColumnElement[bool]:
        """Off-peak jobs that may not run outside their window."""
        gated = Job.schedule_mode == "offpeak"
        if self.outside_fraction > 0:
            gated = and_(gated, Job.preemptible.is_(False))
        return gated

    def _window_open(self) -> ColumnElement[bool]:
        """The job's window is open: any window for a job that names none."""
        names = sorted(self.open_windows)
        if not names:
            return false()
        return or_(Job.window.is_(None), Job.window.in_(names))

    def runnable(self) -> tuple[ColumnElement[bool], ...]:
        """Jobs that no gate holds back now. Written without NOT over nullable columns:
        NOT (NULL) is not true, and would drop a job with no begin time."""
        conditions = [
            or_(Job.schedule_mode != "at", Job.begin_at.is_(None), Job.begin_at <= self.now)
        ]
        if self.windows is not None:
            conditions.append(or_(~self._window_gated(), self._window_open()))
        return tuple(conditions)

    def runnable_by_mode(self) -> tuple[tuple[ColumnElement[bool], ...], ...]:
        """`runnable()` as one condition per schedule mode, each a range of the index on
        (status, schedule_mode, begin_at): the database reads the jobs that may run, not
        every waiting job, however many wait for their begin time."""
        modes: list[tuple[ColumnElement[bool], ...]] = [
            (Job.schedule_mode == "now",),
            (Job.schedule_mode == "at", or_(Job.begin_at.is_(None), Job.begin_at <= self.now)),
        ]
        if self.windows is None:
            modes.append((Job.schedule_mode == "offpeak",))
        else:
            modes.append(
                (
                    Job.schedule_mode == "offpeak",
                    or_(~self._window_gated(), self._window_open()),
                )
            )
        return tuple(modes)

    def window_closed(self, window: str | None) -> ColumnElement[bool]:
        """Gated jobs of one window (None: jobs naming none)."""
        same = Job.window.is_(None) if window is None else Job.window == window
        return and_(self._window_gated(), same)

    def closed_status(self, window: str | None) -> tuple[str, datetime | None] | None:
        """The reason the core gives a gated job of this window, or None when it is open
        (the core then judges the job's runtime and grace against the close)."""
        if (window is None and self.open_windows) or window in self.open_windows:
            return None
        view = JobView(id=0, schedule_mode="offpeak", window=window)
        st = offpeak_window.check(view, self._context())
        return (st.message, st.estimated_start) if not st.ok else None

    def begin_status(self, begin_at: datetime) -> tuple[str, datetime | None]:
        view = JobView(id=0, schedule_mode="at", begin_at=begin_at)
        st = begin_time.check(view, self._context())
        return st.message, st.estimated_start

    def _context(self) -> Context:
        return Context(now=self.now, settings=PolicySettings(), windows=self.windows or ())


@dataclass(frozen=True, slots=True)
class Unsettled:
    """Which kinds of waiting job phase 0 has anything to settle for. Each step's reads
    are narrow, but together they were seven round trips of a quick cycle: on a cluster
    of plain jobs, where every job's end triggers a cycle, one read asks which steps have
    work (bench/drain.py, docs/benchmarks.md)."""

    dependencies: bool  # waiting on their dependencies (app/cycle/dependencies.py)
    arrays: bool  # tasks of a throttled array (app/cycle/arrays.py)
    offpeak: bool  # off-peak jobs (their windows; app/jobs/never_in_window.py)
    begin_times: bool  # jobs with a begin time (`schedule_mode` "at")

    @property
    def clock(self) -> bool:
        """Whether `settle_clock_gates` has jobs to look at."""
        return self.offpeak or self.begin_times


_PENDING = Job.status == JobStatus.PENDING
# Read by every cycle: built once (building and keying it cost more CPU than the read).
_UNSETTLED = select(
    exists().where(_PENDING, Job.dependencies_met.is_(False)),
    exists().where(_PENDING, Job.array_max_running.is_not(None)),
    exists().where(_PENDING, Job.schedule_mode == "offpeak"),
    exists().where(_PENDING, Job.schedule_mode == "at"),
)


def unsettled(session: Session) -> Unsettled:
    """One read (each part by its own index) of which phase 0 steps have jobs to settle."""
    row = session.execute(_UNSETTLED).one()
    return Unsettled(*(bool(part) for part in row))


def settle_clock_gates(session: Session, *, gates: ClockGates) -> datetime | None:
    """Write the reasons of the jobs the clock holds back, and put back in line (NEW) those
    it lets in. Executes, does not commit. Returns when the clock next lets one in.

    Cheap on a deep queue: a job starts waiting for its begin time only as a new arrival
    (submitted, requeued, released, changed: all NEW), so only NEW ones are looked at for
    it; each window's jobs get one UPDATE that touches only rows whose reason differs.
    """
    waiting = (*ELIGIBLE, NOT_THROTTLED)
    # Begin time ahead: the message names the job's own begin time. One UPDATE per begin
    # time among the new arrivals (an array's tasks share theirs).
    arrived = and_(*waiting, Job.pending_reason == ReasonKind.NEW.value, gates.begin_ahead())
    for begin_at in session.scalars(select(Job.begin_at).distinct().where(arrived)).all():
        if begin_at is None:  # not selected (begin_ahead); for the type checker
            continue
        message, starts = gates.begin_status(begin_at)
        session.execute(
            update(Job)
            .where(arrived, Job.begin_at == begin_at)
            .values(
                pending_reason=BEGIN_TIME,
                pending_message=message[:PENDING_MESSAGE_CHARS],
                queue_position=None,
                estimated_start_at=starts,
            )
            .execution_options(synchronize_session=False)
        )
    # Every job waiting for its begin time has that reason: the index finds the first. Only
    # when it is due are jobs put back in line (NEW), and the next one looked up again.
    held = and_(
        *waiting,
        Job.schedule_mode == "at",
        Job.pending_reason == BEGIN_TIME,
        Job.begin_at.is_not(None),
    )
    first_held = select(Job.begin_at).where(held).order_by(Job.begin_at).limit(1)
    wake_at = session.scalar(first_held)
    if wake_at is not None and wake_at <= gates.now:
        session.execute(
            update(Job)
            .where(held, Job.begin_at <= gates.now)
            .values(
                pending_reason=ReasonKind.NEW.value,
                pending_message="begin time reached; waiting for the next scheduling cycle",
                estimated_start_at=None,
            )
            .execution_options(synchronize_session=False)
        )
        wake_at = session.scalar(first_held)  # those due are NEW now: the next one ahead

    if gates.windows is None:
        return wake_at
    windows = session.scalars(
        select(Job.window)
        .distinct()
        .where(Job.status == JobStatus.PENDING, Job.schedule_mode == "offpeak")
    ).all()
    for window in windows:
        closed = gates.closed_status(window)
        if closed is None:
            continue
        message, opens = closed
        if opens is not None and (wake_at is None or opens < wake_at):
            wake_at = opens
        session.execute(
            update(Job)
            .where(
                *waiting,
                gates.window_closed(window),
                or_(
                    Job.pending_reason.is_distinct_from(WINDOW_CLOSED),
                    Job.pending_message.is_distinct_from(message[:PENDING_MESSAGE_CHARS]),
                    Job.estimated_start_at.is_distinct_from(opens),
                    Job.queue_position.is_not(None),
                ),
            )
            .values(
                pending_reason=WINDOW_CLOSED,
                pending_message=message[:PENDING_MESSAGE_CHARS],
                queue_position=None,
                estimated_start_at=opens,
            )
            .execution_options(synchronize_session=False)
        )
    # Let in again: a reason the gate wrote (no position; the core's own "does not fit
    # before the close" has one) on a job no gate holds back now.
    session.execute(
        update(Job)
        .where(
            *waiting,
            Job.schedule_mode == "offpeak",
            Job.pending_reason == WINDOW_CLOSED,
            Job.queue_position.is_(None),
            *gates.runnable(),
        )
        .values(
            pending_reason=ReasonKind.NEW.value,
            pending_message="off-peak window open; waiting for the next scheduling cycle",
            estimated_start_at=None,
        )
        .execution_options(synchronize_session=False)
    )
    return wake_at

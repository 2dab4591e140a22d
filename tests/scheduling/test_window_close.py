"""Preemptible off-peak jobs are stopped when their window closes; others run on."""

from datetime import UTC, datetime, timedelta

from app.scheduling import JobView, RunningJobView, WindowInterval
from app.scheduling.window_close import next_window_stop, window_close_preemptions

T0 = datetime(2026, 11, 23, 6, 0, tzinfo=UTC)
NIGHT = WindowInterval("night", T0 - timedelta(hours=8), T0)
NEXT_NIGHT = WindowInterval("night", T0 + timedelta(hours=16), T0 + timedelta(hours=24))


def running(
    job_id,
    *,
    mode="offpeak",
    preemptible=True,
    window=None,
    started=T0 - timedelta(hours=2),
    grace_s=0,
):
    job = JobView(
        id=job_id, schedule_mode=mode, preemptible=preemptible, window=window, grace_s=grace_s
    )
    return RunningJobView(job=job, placement=(("n1", (0,)),), started_at=started)


def victims(jobs, *, now, windows=(NIGHT, NEXT_NIGHT), preempt=frozenset({"night"})):
    return [
        p.victim_job_id
        for p in window_close_preemptions(jobs, windows, now=now, preempt_on_close=preempt)
    ]


def test_only_preemptible_offpeak_jobs_are_stopped_after_close():
    jobs = [
        running(1),
        running(2, preemptible=False),  # runs on to completion
        running(3, mode="now"),  # not an off-peak job at all
    ]
    assert victims(jobs, now=T0 - timedelta(minutes=1)) == []  # window still open
    assert victims(jobs, now=T0 + timedelta(seconds=1)) == [1]


def test_window_configured_to_let_jobs_run_on():
    assert victims([running(1)], now=T0 + timedelta(seconds=1), preempt=frozenset()) == []


def test_job_started_after_the_close_is_not_a_victim_of_it():
    # Started outside any window (allowed by the capacity rule): no window closed on it.
    late = running(1, started=T0 + timedelta(minutes=5))
    assert victims([late], now=T0 + timedelta(minutes=10)) == []


def test_a_job_naming_another_open_window_keeps_running():
    day = WindowInterval("lunch", T0 - timedelta(hours=1), T0 + timedelta(hours=1))
    jobs = [running(1, window="lunch"), running(2, window="night")]
    assert victims(
        jobs,
        now=T0 + timedelta(seconds=1),
        windows=(NIGHT, day),
        preempt=frozenset({"night", "lunch"}),
    ) == [2]


def test_a_job_with_a_grace_period_is_stopped_that_much_before_the_close():
    # It needs 5 minutes to checkpoint: stopped at 05:55 it is gone by 06:00, when peak
    # work wants its GPUs. A job with the agent's default grace is stopped at the close.
    patient, plain = running(1, grace_s=300), running(2)
    jobs = [patient, plain]
    assert victims(jobs, now=T0 - timedelta(minutes=5, seconds=1)) == []
    assert victims(jobs, now=T0 - timedelta(minutes=5)) == [1]
    assert victims(jobs, now=T0 + timedelta(seconds=1)) == [1, 2]
    (early,) = window_close_preemptions(
        [patient], (NIGHT,), now=T0 - timedelta(minutes=4), preempt_on_close=frozenset({"night"})
    )
    assert early.reason == (
        "off-peak window closes in 240s: stopped now so that its 300s grace period ends by then"
    )
    # A window that goes on past its grace keeps it running.
    long_night = WindowInterval("night", T0 - timedelta(hours=8), T0 + timedelta(minutes=6))
    assert victims([patient], now=T0, windows=(long_night,)) == []


def _next_stop(jobs, *, now, windows=(NIGHT, NEXT_NIGHT), preempt=frozenset({"night"})):
    return next_window_stop(jobs, windows, now=now, preempt_on_close=preempt)


def test_next_window_stop_is_when_the_close_stops_the_job_not_a_second_later():
    # The live scheduler cycles at that time instead of its next beat.
    patient, plain = running(1, grace_s=300), running(2)
    an_hour_before = T0 - timedelta(hours=1)
    assert _next_stop([patient, plain], now=an_hour_before) == T0 - timedelta(minutes=5)
    assert _next_stop([plain], now=an_hour_before) == T0
    at = _next_stop([patient], now=an_hour_before)
    assert victims([patient], now=at - timedelta(seconds=1)) == []
    assert victims([patient], now=at) == [1]
    # Already due: this cycle stops it; nothing to wake for.
    assert _next_stop([patient], now=at) is None


def test_no_window_stop_for_jobs_the_close_leaves_alone():
    now = T0 - timedelta(hours=1)
    assert _next_stop([running(3, preemptible=False), running(4, mode="now")], now=now) is None
    assert _next_stop([running(2)], now=now, preempt=frozenset()) is None  # lets jobs run on
    assert _next_stop([running(2)], now=T0 + timedelta(hours=2)) is None  # no window open

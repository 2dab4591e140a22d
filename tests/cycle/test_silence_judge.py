"""When a node's silence counts against it (pure; see SilenceJudge)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from app.cycle.reconcile import SilenceJudge

T0 = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)


def runs(judge: SilenceJudge, *offsets_s: float) -> list[bool]:
    return [judge.may_judge(T0 + timedelta(seconds=s)) for s in offsets_s]


def test_no_judging_until_a_full_timeout_after_start() -> None:
    judge = SilenceJudge(heartbeat_timeout_s=3)
    assert runs(judge, 0, 1, 2, 3, 4) == [False, False, False, True, True]


def test_a_gap_in_reconcile_runs_restarts_the_grace() -> None:
    """A Redis outage stops beat's reconcile messages and the agents' heartbeats alike."""
    judge = SilenceJudge(heartbeat_timeout_s=3)
    assert runs(judge, 0, 1, 2, 3) == [False, False, False, True]
    # 5 s without a run: heartbeats may have been stuck too; silence is no evidence yet.
    assert runs(judge, 8, 9, 10, 11, 12) == [False, False, False, True, True]


def test_runs_within_the_timeout_keep_judging() -> None:
    judge = SilenceJudge(heartbeat_timeout_s=3)
    assert runs(judge, 0, 3, 6, 9) == [False, True, True, True]


def test_a_failed_run_restarts_the_grace() -> None:
    """A database outage: runs keep coming but fail, and no heartbeat could be stored."""
    judge = SilenceJudge(heartbeat_timeout_s=3)
    assert runs(judge, 0, 1, 2, 3) == [False, False, False, True]
    judge.interrupted()  # the run at 3 s met a database error
    assert runs(judge, 4, 5, 6, 7) == [False, False, False, True]

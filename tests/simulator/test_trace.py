"""The trace reader's errors (file, line, field) and the seeded preemptible draw."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.simulator import TraceJob, read_trace
from app.simulator.trace import TraceError, mark_offpeak, mark_preemptible

HEADER = "job_id,user,vc,jobname,gpu_num,gpu_milli,submit_time,duration"
GOOD = "a,u,v,n,1,1000,0,10"


def write(tmp_path: Path, *rows: str) -> Path:
    path = tmp_path / "t.csv"
    path.write_text("\n".join((HEADER, *rows)) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("b,u,v,n,1,1000,0", "line 3: 7 fields where the header has 8"),
        ("b,u,v,n,1,1000,0,10,9", "line 3: 9 fields where the header has 8"),
        ("b,u,,n,1,1000,0,10", "line 3: vc: missing (the field is empty)"),
        ("b,u,v,n,1,,0,10", "line 3: gpu_milli: missing (the field is empty)"),
        ("b,u,v,n,1,1000,-5,10", "line 3: submit_time: -5 must be a finite number of seconds"),
        ("b,u,v,n,1,1000,soon,10", "line 3: submit_time: 'soon' is not a number of seconds"),
        ("b,u,v,n,1,1000,0,-1", "line 3: duration: -1 must be a finite number of seconds >= 0"),
        ("b,u,v,n,1,1000,0,nan", "line 3: duration: nan must be a finite number of seconds"),
        ("b,u,v,n,1,1000,0,inf", "line 3: duration: inf must be a finite number of seconds"),
        ("b,u,v,n,0,1000,0,10", "line 3: gpu_num: 0: a job needs at least 1 GPU"),
        ("b,u,v,n,-2,1000,0,10", "line 3: gpu_num: -2: a job needs at least 1 GPU"),
        ("b,u,v,n,two,1000,0,10", "line 3: gpu_num: 'two' is not a whole number"),
        ("b,u,v,n,1.5,1000,0,10", "line 3: gpu_num: '1.5' is not a whole number"),
        ("b,u,v,n,1,0,0,10", "line 3: gpu_milli: 0 is outside 1..1000 (1000 = a whole GPU)"),
        ("b,u,v,n,1,1001,0,10", "line 3: gpu_milli: 1001 is outside 1..1000"),
        ("b,u,v,n,2,500,0,10", "line 3: gpu_milli: 500 (a share of a GPU) needs gpu_num 1"),
        ("a,u,v,n,1,1000,0,10", "line 3: job_id: 'a' repeats line 2"),
    ],
)
def test_a_bad_row_is_refused_with_its_line_and_field(
    tmp_path: Path, row: str, message: str
) -> None:
    path = write(tmp_path, GOOD, row, "c,u,v,n,1,1000,0,10")
    with pytest.raises(TraceError) as info:
        read_trace(path)
    assert str(info.value).startswith(f"trace {path}, {message}")


def test_line_numbers_count_blank_lines_and_rows_spanning_lines(tmp_path: Path) -> None:
    # Row 3 is blank (skipped); the row starting on line 4 has a quoted name holding a
    # line break, so the bad row after it starts on line 6.
    path = write(tmp_path, GOOD, "", 'b,u,v,"two\nlines",1,1000,0,10', "c,u,v,n,0,1000,0,10")
    with pytest.raises(TraceError, match=r"line 6: gpu_num: 0: a job needs"):
        read_trace(path)
    path = write(tmp_path, GOOD, "", 'b,u,v,"two\nlines",1,1000,0,10')
    assert [j.jobname for j in read_trace(path)] == ["n", "two\nlines"]


def test_missing_columns_empty_file_and_bad_bytes(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("job_id,user,vc,jobname,gpu_num,submit_time\n")
    with pytest.raises(TraceError, match=r"missing columns gpu_milli, duration$"):
        read_trace(path)
    path.write_text("")
    with pytest.raises(TraceError, match="missing columns job_id, user, vc"):
        read_trace(path)
    path.write_bytes(f"{HEADER}\n{GOOD}\nb,u,v,caf\xe9,1,1000,0,10\n".encode("latin-1"))
    with pytest.raises(TraceError, match="not UTF-8 text"):
        read_trace(path)
    with pytest.raises(TraceError, match=r"cannot read trace .*: No such file"):
        read_trace(tmp_path / "none.csv")


def test_a_byte_order_mark_and_spaces_in_the_header_are_accepted(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    header = ", ".join(HEADER.split(","))
    path.write_text(f"\ufeff{header}\n{GOOD}\n", encoding="utf-8")
    assert read_trace(path) == [TraceJob("a", "u", "v", "n", 1, 1000, 0.0, 10.0)]


def jobs(n: int) -> list[TraceJob]:
    return [TraceJob(f"j{i}", "u", "v", "n", 1, 1000, float(i), 10.0) for i in range(n)]


def preemptible_ids(trace: list[TraceJob]) -> set[str]:
    return {j.job_id for j in trace if j.preemptible}


def test_preemptible_draw_is_seeded_rounded_and_nested() -> None:
    trace = jobs(10)
    assert preemptible_ids(trace) == {j.job_id for j in trace}  # the default: all
    assert preemptible_ids(mark_preemptible(trace, fraction=1, seed=3)) == preemptible_ids(trace)
    assert preemptible_ids(mark_preemptible(trace, fraction=0, seed=3)) == set()
    half = preemptible_ids(mark_preemptible(trace, fraction=0.5, seed=3))
    assert len(half) == 5
    assert half == preemptible_ids(mark_preemptible(trace, fraction=0.5, seed=3))
    assert half != preemptible_ids(mark_preemptible(trace, fraction=0.5, seed=4))
    assert len(preemptible_ids(mark_preemptible(trace, fraction=0.26, seed=3))) == 3
    # A larger fraction keeps the jobs of a smaller one (the same seeded order).
    assert half < preemptible_ids(mark_preemptible(trace, fraction=0.7, seed=3))
    with pytest.raises(ValueError, match=r"within 0\.\.1"):
        mark_preemptible(trace, fraction=1.5, seed=0)


def test_preemptible_and_offpeak_draws_are_independent() -> None:
    # The same seed must not mark the same jobs both ways (each draw has a stream of its
    # own): for every seed tried, the off-peak half and the preemptible half differ.
    trace = jobs(40)
    differ = 0
    for seed in range(20):
        offpeak = {j.job_id for j in mark_offpeak(trace, fraction=0.5, seed=seed) if j.offpeak}
        preemptible = preemptible_ids(mark_preemptible(trace, fraction=0.5, seed=seed))
        differ += offpeak != preemptible
    assert differ == 20

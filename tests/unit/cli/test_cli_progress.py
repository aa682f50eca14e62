"""Progress on stderr: click's bar redrawn in place on a terminal (a real pseudo-terminal here), a bounded number of
informative lines anywhere else, and never a byte on stdout."""
import io
import json
import os
import threading

import click
import pytest
from click.testing import CliRunner
from hypothesis import given, strategies as st

from s2t.cli.progress import progress


def lines_of(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


def terminal_output(report) -> str:
    """What `report(shown)` draws on a pseudo-terminal, read back from its other end while it draws (a terminal's
    buffer is small)."""
    ours, theirs = os.openpty()
    chunks: list[bytes] = []

    def read() -> None:
        while True:
            try:
                chunk = os.read(ours, 65536)
            except OSError:  # EIO: the terminal's side is closed and everything was read
                return
            if not chunk:
                return
            chunks.append(chunk)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        with os.fdopen(theirs, "w") as terminal:
            with progress("bench smoke", "steps", terminal) as shown:
                assert shown.terminal
                report(shown)
    finally:
        reader.join(timeout=10)
        os.close(ours)
    return b"".join(chunks).decode()


def test_a_stage_reported_at_every_row_prints_a_line_per_tenth_off_a_terminal():
    stream = io.StringIO()
    with progress("parity", "rows", stream) as shown:
        assert not shown.terminal
        for done in range(1001):
            shown(done, 1000, "triton risk_pipeline (http)")
    lines = lines_of(stream)
    assert len(lines) == 11
    assert lines[0] == "parity: triton risk_pipeline (http): 0/1000 rows (0%)"
    assert lines[5].startswith("parity: triton risk_pipeline (http): 500/1000 rows (50%) after ")
    assert lines[-1].startswith("parity: triton risk_pipeline (http): 1000/1000 rows (100%) after ")


def test_each_stage_that_starts_over_from_zero_gets_its_own_start_and_end_lines():
    stream = io.StringIO()
    with progress("parity", "rows", stream) as shown:
        for label in ("legacy SavedModel", "onnxruntime risk_scorer.onnx"):
            shown(0, 1000, label)
            shown(1000, 1000, label)
    assert [line.split(" after ")[0] for line in lines_of(stream)] == [
        "parity: legacy SavedModel: 0/1000 rows (0%)", "parity: legacy SavedModel: 1000/1000 rows (100%)",
        "parity: onnxruntime risk_scorer.onnx: 0/1000 rows (0%)",
        "parity: onnxruntime risk_scorer.onnx: 1000/1000 rows (100%)"]


@given(st.integers(0, 5000), st.lists(st.integers(0, 6000), max_size=300))
def test_off_a_terminal_a_stage_never_prints_more_than_eleven_lines(total, reports):
    stream = io.StringIO()
    with progress("soak", "s", stream) as shown:
        for done in sorted(reports):
            shown(done, total, "sent 0, answered 0, errors 0")
    assert len(lines_of(stream)) <= 11
    if reports and max(reports) >= total:
        assert lines_of(stream)[-1].startswith(f"soak: sent 0, answered 0, errors 0: {total}/{total} s")


def test_lines_for_people_keep_their_place_among_the_progress_lines_off_a_terminal():
    stream = io.StringIO()
    with progress("bench smoke", "steps", stream) as shown:
        shown(0, 2, "cold start 1/1")
        shown.echo("cold start 1.20 s (1 starts)")
        shown(1, 2, "cold start 1/1")
    assert [line.split(" after ")[0] for line in lines_of(stream)] == [
        "bench smoke: cold start 1/1: 0/2 steps (0%)", "cold start 1.20 s (1 starts)",
        "bench smoke: cold start 1/1: 1/2 steps (50%)"]


def test_work_that_fails_says_where_it_stopped():
    stream = io.StringIO()
    with pytest.raises(RuntimeError):
        with progress("soak", "s", stream) as shown:
            shown(7, 15, "sent 350, answered 350, errors 0")
            raise RuntimeError("tritonserver exited")
    assert lines_of(stream)[-1].startswith("soak: stopped at sent 350, answered 350, errors 0: 7/15 s (46%) after ")


def test_on_a_terminal_the_bar_is_redrawn_in_place_and_each_stage_ends_its_own_line():
    def report(shown):
        for label in ("legacy SavedModel", "onnxruntime risk_scorer.onnx"):
            for done in range(0, 1001, 100):
                shown(done, 1000, label)

    drawn = terminal_output(report)
    lines = drawn.replace("\r\n", "\n").split("\n")
    assert len(lines) == 3 and lines[-1] == ""  # one line per stage, each closed by its own newline
    for line, label in zip(lines, ("legacy SavedModel", "onnxruntime risk_scorer.onnx")):
        redraws = line.split("\r")
        assert len(redraws) > 10  # drawn again at every report, over itself
        assert f"bench smoke (steps)  [{'#' * 36}]  1000/1000  100%  {label}" in redraws[-1]


def test_on_a_terminal_a_line_for_people_goes_above_the_bar_which_is_drawn_again_below_it():
    def report(shown):
        shown(0, 4, "cold start 1/1")
        shown.echo("cold start 1.20 s (1 starts)")
        shown(1, 4, "perf_analyzer risk_pipeline http b=1 c=4")

    drawn = terminal_output(report)
    before, after = drawn.split("\x1b[2Kcold start 1.20 s (1 starts)\r\n")
    assert "0/4" in before and "cold start 1/1" in before
    assert after.startswith("\rbench smoke (steps)  [") and "1/4" in after and "perf_analyzer risk_pipeline" in after


def test_through_click_progress_goes_to_stderr_and_stdout_keeps_the_result_alone():
    @click.command()
    def scored() -> None:
        with progress("parity", "rows") as shown:
            for done in range(0, 1001, 10):
                shown(done, 1000, "onnxruntime risk_scorer.onnx")
        click.echo(json.dumps({"passed": True, "rows": 1000}))

    result = CliRunner().invoke(scored)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"passed": True, "rows": 1000}
    assert "parity: onnxruntime risk_scorer.onnx: 1000/1000 rows (100%)" in result.stderr
    assert len(result.stderr.splitlines()) == 11

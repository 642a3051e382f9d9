"""One result's share of a session's output (faces/budget.py): within the budget, head and tail
kept, one marker that names exactly what it left out and the call that reads it, and only a
window read at each end however big the output."""

from __future__ import annotations

from procpilot.engine.capture import Stream
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.supervisor import Supervisor
from procpilot.faces.budget import binary_note, log_call, read_budgeted


async def test_output_that_fits_is_shown_whole(supervisor: Supervisor) -> None:
    s = await supervisor.run(SpawnSpec("printf 'one\\ntwo\\n'"), scope="a", yield_ms=None)
    shown = await read_budgeted(s, Stream.COMBINED, 0, 0, 2000)
    assert shown.text == "one\ntwo\n"
    assert (shown.cut_chars, shown.cut_lines, shown.binary) == (0, 0, 0)
    assert (shown.end, shown.end_line) == (8, 2)  # where a follower reads next


async def test_the_marker_names_exactly_the_lines_it_cut(supervisor: Supervisor) -> None:
    s = await supervisor.run(SpawnSpec("seq 1 5000"), scope="a", yield_ms=None)
    total = s.output[Stream.COMBINED].size
    shown = await read_budgeted(s, Stream.COMBINED, 0, 0, 2000)
    assert len(shown.text) <= 2000
    head, _, rest = shown.text.partition("…[")
    marker, _, tail = rest.partition("\n")
    assert shown.text.startswith("1\n2\n3\n") and shown.text.endswith("4999\n5000\n")
    call = log_call(s.id, Stream.COMBINED, shown.first_cut_line, shown.cut_lines)
    assert call in marker and f"{shown.cut_chars:,} characters" in marker
    # Every line is either shown or among the cut ones, never both, never neither.
    shown_numbers = [int(n) for n in (head + tail).split()]
    cut_numbers = list(range(shown.first_cut_line + 1, shown.first_cut_line + shown.cut_lines + 1))
    assert sorted(shown_numbers + cut_numbers) == list(range(1, 5001))
    assert shown.cut_chars == total - len(head) - len(tail)  # ASCII: one character a byte
    assert (shown.end, shown.end_line) == (total, 5000)


async def test_a_huge_output_costs_one_window_at_each_end(supervisor: Supervisor) -> None:
    s = await supervisor.run(SpawnSpec("seq 1 200000"), scope="a", yield_ms=None)
    total = s.output[Stream.COMBINED].size
    shown = await read_budgeted(s, Stream.COMBINED, 0, 0, 2000)
    assert shown.read_bytes < total // 50  # only the two windows were read, not 1.2 MB
    assert len(shown.text) <= 2000
    assert shown.text.startswith("1\n2\n") and shown.text.endswith("199999\n200000\n")
    assert shown.cut_lines > 190_000 and "cut here" in shown.text


async def test_a_budget_too_small_for_a_marker_keeps_the_newest_output(supervisor: Supervisor) -> None:
    s = await supervisor.run(SpawnSpec("seq 1 5000"), scope="a", yield_ms=None)
    shown = await read_budgeted(s, Stream.COMBINED, 0, 0, 100)
    assert len(shown.text) <= 100
    assert shown.text.endswith("4999\n5000\n")
    assert "cut here" not in shown.text
    assert shown.cut_chars == s.output[Stream.COMBINED].size - len(shown.text)


def test_the_log_call_and_the_binary_note_say_what_a_model_needs() -> None:
    assert log_call("abc", Stream.COMBINED, 10, 5) == "process log sessionId=abc offset=10 limit=5"
    assert log_call("abc", Stream.STDERR, 0, 1) == "process log sessionId=abc stream=stderr offset=0 limit=1"
    assert binary_note(0, 100, "x") is None  # readable output gets no note
    note = binary_note(12, 1000, "the log")
    assert note is not None and "12 bytes of binary output" in note and "among 1,000 bytes" in note
    assert "the log" in note
    only = binary_note(1000, 1000, "the log")
    assert only is not None and "among" not in only

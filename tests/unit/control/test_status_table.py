"""`s2t status` for people: the supervisor's record with ISO times and ages, not raw JSON with epoch seconds."""
import calendar
import time

import pytest

from s2t.control.status import supervisor_lines, table

NOW = calendar.timegm(time.strptime("2026-12-01T12:00:00", "%Y-%m-%dT%H:%M:%S"))
RECORD = {
    "server_pid": 4242, "started_at": NOW - 3 * 3600 - 125, "server_restarts": 1, "server_hangs": 1,
    "reloads": [{"model": "risk_router", "reason": "stub_died", "count": 2}],
    "reload_failures": {"risk_stream": 1}, "given_up": ["risk_stream"],
    "events": [{"at": NOW - 90, "event": "reload", "model": "risk_router", "reason": "stub_died"},
               {"at": NOW - 5, "event": "gave_up", "model": "risk_stream", "reason": "error_rate",
                "detail": "5 reloads in a row did not heal it"}],
}


def test_the_supervisor_record_reads_as_times_ages_and_counts():
    assert supervisor_lines(RECORD, NOW) == [
        "supervisor: server pid 4242, supervising since 2026-12-01T08:57:55Z (3 h 2 min ago), 1 server restart "
        "(1 after a hang)",
        "  reloads: risk_router (stub_died) x2",
        "  failed reloads: risk_stream x1",
        "  given up (failing, not reloaded again; the other models keep serving): risk_stream",
        "  2026-12-01T11:58:30Z (1 min 30 s ago) reload risk_router stub_died",
        "  2026-12-01T11:59:55Z (5 s ago) gave_up risk_stream error_rate 5 reloads in a row did not heal it",
    ]


@pytest.mark.parametrize("age, shown", [(0, "0 s"), (59, "59 s"), (61, "1 min 1 s"), (3600, "1 h"),
                                        (90061, "1 d 1 h")])
def test_ages_show_the_two_largest_units(age, shown):
    record = {"server_pid": 1, "started_at": NOW - age, "server_restarts": 0, "reloads": [], "events": []}
    assert supervisor_lines(record, NOW)[0].endswith(f"({shown} ago), 0 server restarts")


def test_a_quiet_supervisor_says_none_and_only_the_last_events_are_listed():
    events = [{"at": NOW - i, "event": "reload", "model": f"m{i}", "reason": "stub_died"} for i in range(9, 0, -1)]
    lines = supervisor_lines({"server_pid": 7, "reloads": [], "events": events}, NOW, events_shown=3)
    assert lines[:2] == ["supervisor: server pid 7, 0 server restarts", "  reloads: none"]
    assert [line.split()[-2] for line in lines[2:]] == ["m3", "m2", "m1"]


def test_the_table_never_prints_the_record_as_json():
    text = table({"models": {}, "supervisor": RECORD, "history": []})
    assert "{" not in text and "started_at" not in text and "2026-12-01T08:57:55Z" in text

"""The hostile soak's own machinery on plain callables and real processes, without a server: valid paths keep
their pace and cap, a broken client is an unanswered request, and leftovers are found by pid and by region."""
import subprocess
import sys
import threading
import time

from s2t.soak.hostile import runner, watch as watching
from s2t.soak.hostile.report import ANSWERED, NOT_SENT, UNANSWERED
from s2t.soak.hostile.valid_paths import MAX_IN_FLIGHT, Clock, ValidPath


def test_a_valid_path_counts_ticks_over_its_in_flight_cap_as_not_sent_and_waits_for_every_request():
    release, started = threading.Event(), []

    def held(k):
        started.append(k)
        release.wait(10)
        return [(ANSWERED, 0.001, "")]

    path = ValidPath("held", held, rate=100, clock=Clock(0.2))
    path.start()
    # 20 ticks in 0.2 s: the first MAX_IN_FLIGHT are held, the rest find the cap reached. Once every tick is counted
    # the run is over, but the path still waits for the held requests.
    deadline = time.monotonic() + 10
    while len(path.samples) < 20 - MAX_IN_FLIGHT and time.monotonic() < deadline:
        time.sleep(0.01)
    assert path.is_alive() and len(started) == MAX_IN_FLIGHT
    release.set()
    path.join(10)
    assert not path.is_alive()
    outcomes = [s.outcome for s in path.samples]
    assert outcomes.count(ANSWERED) == MAX_IN_FLIGHT == len(started)
    assert outcomes.count(NOT_SENT) == 20 - MAX_IN_FLIGHT
    assert {s.phase for s in path.samples} <= {"before", "during", "after"}


def test_a_stopped_valid_path_makes_no_more_calls_and_ends_before_the_run_would():
    calls = []
    path = ValidPath("stopped", lambda k: calls.append(k) or [(ANSWERED, 0.001, "")], rate=20,
                                  clock=Clock(600.0))
    path.start()
    path.stop.set()
    path.join(30)  # a path that ignored the stop would run for the clock's 600 s
    assert not path.is_alive()
    made = len(calls)
    assert made < 20 and len(path.samples) == made


def test_a_client_that_raises_is_an_unanswered_request_and_the_path_goes_on():
    def broken(k):
        if k % 2:
            raise ConnectionResetError("peer went away")
        return [(ANSWERED, 0.001, "")]

    path = ValidPath("broken", broken, rate=50, clock=Clock(0.2))
    path.start()
    path.join(10)
    unanswered = [s for s in path.samples if s.outcome == UNANSWERED]
    assert len(unanswered) == 5 and len(path.samples) == 10
    assert unanswered[0].detail == "ConnectionResetError: peer went away"


def test_leftovers_name_a_process_of_the_run_still_alive_and_a_stub_region_still_in_shm(tmp_path, monkeypatch):
    monkeypatch.setattr(watching, "SHM_DIR", tmp_path)
    (tmp_path / "triton_python_backend_shm_region_soak").write_bytes(b"\0")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        watch = watching.Watch(child.pid, child.pid, Clock(1.0), every_s=1.0)
        watch.look()
        watch.regions.add("triton_python_backend_shm_region_soak")
        processes, regions = watching.leftovers(watch, grace_s=0)
        assert processes == [f"{child.pid} {watch.seen[child.pid].name}"]
        assert regions == ["triton_python_backend_shm_region_soak"]
    finally:
        child.kill()
        child.wait()
    (tmp_path / "triton_python_backend_shm_region_soak").unlink()
    assert watching.leftovers(watch, grace_s=0) == ([], [])


def test_the_rss_of_both_process_groups_is_sampled_per_phase():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        watch = watching.Watch(child.pid, child.pid, Clock(10.0), every_s=1.0)
        watch.sample()
        watch.sample()
    finally:
        child.kill()
        child.wait()
    for group in ("serving", "gateway"):
        size = watch.rss[group]["before"]
        assert size["samples"] == 2 and size["max"] >= size["last"] > 0
    assert set(watch.rss["serving"]) == {"before"}, "a sample belongs to the phase it was taken in"


def test_services_pointed_at_are_found_by_the_port_they_listen_on_and_not_started():
    import os
    import socket
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    try:
        services = runner.running_services({"http": f"localhost:{port}", "grpc": "localhost:1",
                                                  "metrics": "localhost:1", "gateway": "localhost:1"})
    finally:
        listener.close()
    assert services.serving_pid == os.getpid() and services.gateway_pid is None
    assert services.started is False and services.exit_codes == {}


def test_paced_deadline_callers_stop_at_the_end_of_the_flood_and_report_what_they_sent():
    """Paced at 50 a second, 10,000 calls would take 200 s: the flood must end with its window (0.6 s here) and count
    what it sent, not sleep towards calls that are past the window (which left the flood unreported and still
    calling after the floods were over)."""
    from s2t.soak.hostile import careless_callers
    from tests.conftest import free_port
    started = time.monotonic()
    result = careless_callers.grpc_deadlines(f"127.0.0.1:{free_port()}", [{"x": 1}], count=10_000, callers=4,
                                             deadline=started + 0.6, rate_per_s=50.0)
    took = time.monotonic() - started
    assert took < 5, f"the flood ran {took:.1f} s past a 0.6 s window"
    # Nothing listens on the port: every call is answered UNAVAILABLE by the client's channel, and counted.
    assert 10 <= result["sent"] <= 40 and sum(result["outcomes"].values()) == result["sent"], result
    assert result["unanswered"] == 0

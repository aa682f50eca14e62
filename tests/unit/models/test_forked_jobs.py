"""The pool convert_many's runner converts in: each job in its own forked child, its exit code and its log its own."""
import os
import sys
import time

from s2t.models import forked_jobs


def _work(job: dict) -> int:
    print(f"job {job['name']} in {os.getpid()}")
    if job["name"] == "raises":
        raise ValueError("a conversion that raised")
    if job["name"] == "hangs":
        time.sleep(60)
    if job["name"] == "exits":
        sys.exit(7)
    return job.get("code", 0)


def test_each_job_gets_its_own_child_log_and_exit_code_in_the_jobs_order(tmp_path):
    names = ["ok", "refused", "raises", "exits", "ok2"]
    jobs = [{"name": n, "log": str(tmp_path / f"{n}.log"), "code": 3 if n == "refused" else 0} for n in names]
    codes = forked_jobs.run(jobs, _work, workers=2, timeout_s=30)
    assert codes == [0, 3, 1, 7, 0]
    pids = set()
    for name in names:
        log = (tmp_path / f"{name}.log").read_text()
        assert log.startswith(f"job {name} in ")
        pids.add(log.split()[3])
    assert len(pids) == len(names) and str(os.getpid()) not in pids
    assert "ValueError: a conversion that raised" in (tmp_path / "raises.log").read_text()


def test_a_job_past_its_time_is_killed_and_the_others_still_run(tmp_path):
    jobs = [{"name": n, "log": str(tmp_path / f"{n}.log")} for n in ("hangs", "ok", "ok2")]
    started = time.monotonic()
    assert forked_jobs.run(jobs, _work, workers=1, timeout_s=0.5) == [-9, 0, 0]
    assert time.monotonic() - started < 30


def test_no_jobs_run_nothing(tmp_path):
    assert forked_jobs.run([], _work, workers=4, timeout_s=1) == []

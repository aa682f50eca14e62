"""`s2t soak`: a fixed request rate on risk_pipeline for minutes, watching the memory of every process serving it.

Resident memory (RSS less file-backed pages, resident.py) is sampled for tritonserver and each python stub (by model
instance) and summed for the serving tree; each series is fitted over time and projected to 72 hours (rss_trend).
The run holds when every request was answered, tritonserver is the same process at the end as at the start, and the
serving tree's projected growth is under 5% (the one memory rule of every soak); each process's projection says
where growth is.
"""
from __future__ import annotations

import json
import math
import threading
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, ContextManager

import numpy as np
import psutil

from s2t.models import dataset
from s2t.on_progress import OnProgress, no_progress
from s2t.soak import rss_trend
from s2t.soak.resident import owned_bytes
from s2t.serve.supervisor import stubs_of
from s2t.wire.names import PAYLOAD


SERVING_TREE = "serving tree"


def serving_rss(server_pid: int) -> dict[str, int]:
    """Resident memory by process (resident.owned_bytes: RSS less file-backed pages): `tritonserver`, one entry per
    stub, `instance@version`, and their sum, SERVING_TREE."""
    sizes = {"tritonserver": owned_bytes(server_pid)}
    for stub in stubs_of(server_pid).values():
        try:
            sizes[f"{stub.instance}@{stub.version}"] = owned_bytes(stub.pid)
        except psutil.NoSuchProcess:
            continue
    sizes[SERVING_TREE] = sum(sizes.values())
    return sizes


def sample_every_s(seconds: float) -> float:
    """Ten seconds between RSS samples, less in a run under five minutes so that its fit has 30 points."""
    return min(10.0, max(0.2, seconds / 30))


@dataclass
class SoakReport:
    seconds: float
    rate: float
    sent: int = 0
    answered: int = 0
    errors: list[str] = field(default_factory=list)
    samples: list[dict] = field(default_factory=list)  # {"at": s, "rss": {process: bytes}}
    # tritonserver's pid at the start and the end (None: gone), and whether the end's is the start's process.
    tritonserver: dict = field(default_factory=dict)

    def rss_trend(self) -> dict[str, dict]:
        """Per process and for the serving tree: the least-squares fit of its RSS after the warm-up, projected to
        72 hours (rss_trend.trend)."""
        names = {name for sample in self.samples for name in sample["rss"]}
        return rss_trend.trends({name: [(s["at"], s["rss"][name]) for s in self.samples if name in s["rss"]]
                                 for name in sorted(names)}, self.seconds)

    def verdicts(self) -> dict[str, dict]:
        unanswered = self.sent - self.answered - len(self.errors)
        same = self.tritonserver.get("same_process")
        return {
            "every_request_answered": {
                "holds": self.sent > 0 and not self.errors and unanswered == 0,
                "detail": f"{self.answered} of {self.sent} answered, {len(self.errors)} errors, "
                          f"{unanswered} unanswered"},
            "same_tritonserver_process": {
                "holds": same, "detail": "not watched" if same is None else
                f"pid {self.tritonserver.get('start')} at the start, {self.tritonserver.get('end')} at the end"
                + ("" if same else " (restarted)")},
            # The rule holds the serving tree as a whole; each process's fit is in the report to say which grew.
            "rss_projection": rss_trend.verdict({SERVING_TREE: self.rss_trend()[SERVING_TREE]})
            if any(SERVING_TREE in s["rss"] for s in self.samples) else rss_trend.verdict({}),
        }

    def holds(self) -> bool:
        return all(v["holds"] is True for v in self.verdicts().values())

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "errors": self.errors[:20], "error_count": len(self.errors),
                           "rss_trend": self.rss_trend(), "verdicts": self.verdicts()}, indent=2)

    def table(self) -> str:
        fits = self.rss_trend()
        last = self.samples[-1]["rss"]
        lines = [f"soak: {self.seconds:.0f} s at {self.rate:g} records/s: sent {self.sent}, answered {self.answered}, "
                 f"errors {len(self.errors)}",
                 f"{'process':<28} {'RSS MB':>8} {'MiB/h':>8} {'72 h':>8}"]
        for name in sorted(last, key=lambda n: (n == SERVING_TREE, n)):
            fit = fits.get(name, {})
            slope, growth = fit.get("slope_bytes_per_hour"), fit.get("projected_growth")
            lines.append(f"{name:<28} {last[name] / 2**20:>8.1f} "
                         f"{'-' if slope is None else f'{slope / 2**20:+.1f}':>8} "
                         f"{'-' if growth is None else f'{growth * 100:+.1f}%':>8}")
        lines.append("verdicts:")
        for name, verdict in self.verdicts().items():
            mark = {True: "holds", False: "FAILS", None: "not measured"}[verdict["holds"]]
            lines.append(f"  {name:<26} {mark:<13} {verdict['detail']}")
        return "\n".join(lines)


def same_process(pid: int, created: float) -> bool:
    try:
        return psutil.Process(pid).create_time() == created
    except psutil.NoSuchProcess:
        return False


def soak(server_pid: int, grpc_url: str, data_csv: Path, seconds: float, rate: float,
         sample_every: float | None = None, on_progress: OnProgress = no_progress,
         current_server_pid: Callable[[], int | None] | None = None) -> SoakReport:
    """Open loop: a request every 1/rate s whatever the answers do, so that slow answers cannot lower the load.

    `on_progress` hears the whole seconds gone out of `seconds`, with the requests and errors so far, once a second.
    `current_server_pid` says which tritonserver serves at the end (a supervisor may have started another); the
    RSS samples follow `server_pid` alone, and stop when it is gone.
    """
    import tritonclient.grpc as grpc

    records = [json.dumps({"features": r}).encode() for r in dataset.load(data_csv).records()]
    report = SoakReport(seconds, rate)
    sample_every = sample_every or sample_every_s(seconds)
    created = psutil.Process(server_pid).create_time()
    report.tritonserver = {"start": server_pid, "end": None, "same_process": None}
    lock = threading.Lock()
    client = grpc.InferenceServerClient(grpc_url)

    def done(result, error):
        with lock:
            if error is not None:
                report.errors.append(str(error))
            else:
                report.answered += 1

    def counts() -> str:
        with lock:
            return f"sent {report.sent}, answered {report.answered}, errors {len(report.errors)}"

    planned = math.ceil(seconds)
    started = time.monotonic()
    next_sample, shown = started, -1
    try:
        while (now := time.monotonic()) - started < seconds:
            if int(now - started) > shown:
                shown = int(now - started)
                on_progress(shown, planned, counts())
            if now >= next_sample and same_process(server_pid, created):
                report.samples.append({"at": round(now - started, 2), "rss": serving_rss(server_pid)})
                next_sample += sample_every
            tensor = grpc.InferInput(PAYLOAD, [1, 1], "BYTES")
            tensor.set_data_from_numpy(np.array([[records[report.sent % len(records)]]], dtype=object))
            client.async_infer("risk_pipeline", [tensor], done)
            report.sent += 1
            time.sleep(max(0.0, started + report.sent / rate - time.monotonic()))
        on_progress(planned, planned, f"{counts()}; waiting for the last answers")
        deadline = time.monotonic() + 30
        while report.answered + len(report.errors) < report.sent and time.monotonic() < deadline:
            time.sleep(0.05)
        if same_process(server_pid, created):
            report.samples.append({"at": round(time.monotonic() - started, 2), "rss": serving_rss(server_pid)})
        end = current_server_pid() if current_server_pid is not None else server_pid
        report.tritonserver.update(end=end, same_process=end == server_pid and same_process(server_pid, created))
        on_progress(planned, planned, counts())
    finally:
        client.close()
    return report


def supervised_soak(repositories: list[Path], data_csv: Path, seconds: float, rate: float, report_path: Path,
                    starting: Callable[[str], ContextManager] = lambda what: nullcontext(),
                    on_progress: OnProgress = no_progress) -> SoakReport:
    """`soak` against a supervised tritonserver of its own on free ports, stopped at the end; its log beside the
    report. `starting` frames the server's start (the command line times it)."""
    from s2t.serve.triton_server import TritonServer, free_port

    server = TritonServer(repositories, free_port(), free_port(), free_port(), supervise=True,
                          log_path=report_path.with_suffix(".tritonserver.log"), exit_timeout_seconds=10)
    with starting("starting tritonserver (supervised)"):
        server.start()
    try:
        return soak(server.process.pid, server.grpc_url, data_csv, seconds, rate, on_progress=on_progress,
                    current_server_pid=lambda: server.process.pid if server.process is not None else None)
    finally:
        server.stop()

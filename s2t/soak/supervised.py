"""`s2t soak`: a fixed request rate on risk_pipeline for minutes, watching the memory of every process serving it.

RSS is sampled for tritonserver and each python stub (by model instance); growth is the last sample against the
first one taken after a warm-up minute (or a tenth of the run when shorter), so that allocator warm-up is not
counted as a leak.
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
from s2t.bench.harness.process_tree import process_rss
from s2t.on_progress import OnProgress, no_progress
from s2t.serve.supervisor import stubs_of
from s2t.wire.names import PAYLOAD


def serving_rss(server_pid: int) -> dict[str, int]:
    """RSS by process: `tritonserver` and one entry per stub, `instance@version`."""
    sizes = {"tritonserver": process_rss(server_pid)}
    for stub in stubs_of(server_pid).values():
        try:
            sizes[f"{stub.instance}@{stub.version}"] = process_rss(stub.pid)
        except psutil.NoSuchProcess:
            continue
    return sizes


@dataclass
class SoakReport:
    seconds: float
    rate: float
    sent: int = 0
    answered: int = 0
    errors: list[str] = field(default_factory=list)
    samples: list[dict] = field(default_factory=list)  # {"at": s, "rss": {process: bytes}}

    def growth(self) -> dict[str, float]:
        """Per process: (last - baseline) / baseline, baseline being the first sample after warm-up."""
        warm = min(60.0, self.seconds / 10)
        baseline = next((s for s in self.samples if s["at"] >= warm), self.samples[0])
        last = self.samples[-1]
        return {name: (last["rss"][name] - size) / size for name, size in baseline["rss"].items()
                if name in last["rss"] and size}

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "errors": self.errors[:20], "error_count": len(self.errors),
                           "growth": self.growth()}, indent=2)

    def table(self) -> str:
        growth = self.growth()
        last = self.samples[-1]["rss"]
        lines = [f"soak: {self.seconds:.0f} s at {self.rate:g} records/s: sent {self.sent}, answered {self.answered}, "
                 f"errors {len(self.errors)}",
                 f"{'process':<28} {'RSS MB':>8} {'growth':>8}"]
        for name in sorted(last):
            lines.append(f"{name:<28} {last[name] / 2**20:>8.1f} {growth.get(name, 0) * 100:>7.2f}%")
        lines.append(f"{'total':<28} {sum(last.values()) / 2**20:>8.1f}")
        return "\n".join(lines)


def soak(server_pid: int, grpc_url: str, data_csv: Path, seconds: float, rate: float,
         sample_every: float = 10.0, on_progress: OnProgress = no_progress) -> SoakReport:
    """Open loop: a request every 1/rate s whatever the answers do, so that slow answers cannot lower the load.

    `on_progress` hears the whole seconds gone out of `seconds`, with the requests and errors so far, once a second.
    """
    import tritonclient.grpc as grpc

    records = [json.dumps({"features": r}).encode() for r in dataset.load(data_csv).records()]
    report = SoakReport(seconds, rate)
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
            if now >= next_sample:
                report.samples.append({"at": round(now - started, 1), "rss": serving_rss(server_pid)})
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
        report.samples.append({"at": round(time.monotonic() - started, 1), "rss": serving_rss(server_pid)})
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
        return soak(server.process.pid, server.grpc_url, data_csv, seconds, rate, on_progress=on_progress)
    finally:
        server.stop()

"""Baseline 1: the service such migrations usually reach for, doing the same work as risk_pipeline.

FastAPI + uvicorn (2 workers, uvloop/httptools) + ONNX Runtime with one intra-op thread: the legacy JSON record
in, parsed and validated by the same RecordDecoder and feature spec as skill_adapter, scored by the same ONNX
file as risk_scorer, decided by the same policy with the thresholds read from risk_decision's config.
Started by `s2t bench` as `uvicorn --factory tools.bench.fastapi_baseline:create_app`, configured through the
environment because uvicorn's workers import the app themselves.
"""
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from backends.decision_policy import decide
from backends.feature_spec import FeatureSpec
from backends.record_decoder import RecordDecoder

MODEL_ENV, SPEC_ENV, DECISION_ENV = "S2T_BASELINE_MODEL", "S2T_BASELINE_SPEC", "S2T_BASELINE_DECISION_CONFIG"
ROUTE = "/score"


class Scorer:
    """Record bytes -> (probability, decision) or a RecordError, one record per call as the legacy served them."""

    def __init__(self, model: Path, spec: Path, decision_config: Path):
        from tools.bench.inprocess import session
        self._session = session(model)  # the same one-thread ONNX Runtime session as the in-process baseline
        self._decoder = RecordDecoder(FeatureSpec.from_file(spec))
        from tools.model_config import decision_thresholds
        self._thresholds = decision_thresholds(decision_config)

    def score(self, payload: bytes) -> tuple[float, str]:
        decoded = self._decoder.decode([payload])
        if decoded.errors[0] is not None:
            raise decoded.errors[0]
        (probability,) = self._session.run(None, {"categorical": decoded.categorical, "numeric": decoded.numeric})
        decision = decide(probability, self._thresholds)
        return float(np.ravel(probability)[0]), np.ravel(decision)[0].decode()


def create_app():
    # Imported here, not at the top: `Request` must resolve at runtime for FastAPI to inject it.
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    from backends.record_decoder import RecordError

    scorer = Scorer(Path(os.environ[MODEL_ENV]), Path(os.environ[SPEC_ENV]), Path(os.environ[DECISION_ENV]))
    app = FastAPI()

    @app.get("/health")
    async def health():
        return {"ready": True}

    @app.post(ROUTE)
    async def score(request: Request):
        # Scoring one record takes ~0.1 ms: inline on the event loop, as a thread-pool hop would cost more.
        try:
            probability, decision = scorer.score(await request.body())
        except RecordError as err:
            return JSONResponse({"error": str(err)}, status_code=400)
        return {"probability": probability, "decision": decision}

    return app


@dataclass
class BaselineServer:
    """The baseline as a subprocess on a free port; `start()` returns once both workers answer."""

    model: Path
    spec: Path
    decision_config: Path
    port: int
    workers: int = 2
    log_path: Path | None = None
    process: subprocess.Popen | None = None
    startup_seconds: float = field(default=float("nan"))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> "BaselineServer":
        env = dict(os.environ, **{MODEL_ENV: str(Path(self.model).resolve()), SPEC_ENV: str(Path(self.spec).resolve()),
                                  DECISION_ENV: str(Path(self.decision_config).resolve())})
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        started = time.monotonic()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "--factory", "tools.bench.fastapi_baseline:create_app",
             "--host", "127.0.0.1", "--port", str(self.port), "--workers", str(self.workers),
             "--log-level", "warning", "--no-access-log"],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        if log is not subprocess.DEVNULL:
            log.close()
        try:
            self._wait_ready(started + timeout)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started
        return self

    def _wait_ready(self, deadline: float) -> None:
        # Each worker loads its own session: ask until a handful of answers came back in a row.
        answers = 0
        while answers < 2 * self.workers:
            if self.process.poll() is not None:
                raise RuntimeError(f"the FastAPI baseline exited with code {self.process.returncode}"
                                   + (f"; see {self.log_path}" if self.log_path else ""))
            if time.monotonic() > deadline:
                raise RuntimeError("the FastAPI baseline is not ready")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as resp:
                    answers += resp.status == 200
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                answers = 0
                time.sleep(0.2)

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()

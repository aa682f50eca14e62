"""Baseline 1: FastAPI + ONNX Runtime doing the same work as risk_pipeline, built as well as FastAPI allows.

Two apps, both served by `uvicorn[standard]` (uvloop, httptools) with 2 workers, one ONNX Runtime session with one
intra-op thread per worker:

- `create_app` (the baseline): the raw body, scored inline on the event loop by the very code risk_pipeline runs
  (`FusedPipeline`: the same RecordDecoder, the feature spec read from the same ONNX file, the thresholds from
  risk_pipeline's config), the answer rendered by orjson. Scoring one record takes tens of microseconds, less than
  a thread-pool hop.
- `create_docs_app` (the check): written the way FastAPI's documentation shows: a Pydantic model for the body, a
  plain `def` path operation (blocking work goes to the thread pool), a return type, which FastAPI 0.130+ serializes
  to JSON bytes through Pydantic (its docs now recommend that over `ORJSONResponse`, which is deprecated). The bench
  measures both; the stronger one is the baseline.

Started by `s2t bench` as `uvicorn --factory ...`, configured through the environment because uvicorn's workers
import the app themselves.
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

MODEL_ENV, PIPELINE_ENV = "S2T_BASELINE_MODEL", "S2T_BASELINE_PIPELINE_CONFIG"
ROUTE = "/score"
APPS = {"baseline": "s2t.bench.baselines.fastapi_baseline:create_app",
        "fastapi-docs": "s2t.bench.baselines.fastapi_baseline:create_docs_app"}


def _pipeline():
    from s2t.backends.scoring.fused_pipeline import FusedPipeline, PipelineSettings
    from s2t.backends.runtime.model_parameters import read_parameters
    from s2t.backends.scoring.ort_runner import ModelConfigError
    from s2t.triton_config import backend_parameters, load

    settings = read_parameters(PipelineSettings, backend_parameters(load(Path(os.environ[PIPELINE_ENV]))),
                               ModelConfigError)
    return FusedPipeline(Path(os.environ[MODEL_ENV]), settings)


def create_app():
    # Imported here, not at the top: `Request` must resolve at runtime for FastAPI to inject it.
    import orjson
    from fastapi import FastAPI, Request, Response

    pipeline = _pipeline()
    app = FastAPI()

    @app.get("/health")
    async def health():
        return {"ready": True}

    @app.post(ROUTE)
    async def score(request: Request):
        scored = pipeline.score([await request.body()])
        if scored.errors[0] is not None:
            return Response(orjson.dumps({"error": str(scored.errors[0])}), 400, media_type="application/json")
        return Response(orjson.dumps({"probability": float(scored.probability[0, 0]),
                                      "decision": scored.decision[0, 0].decode()}), media_type="application/json")

    return app


def create_docs_app():
    from typing import Optional, Union

    import numpy as np
    from fastapi import FastAPI, HTTPException
    from pydantic import BaseModel, StrictFloat, StrictInt, StrictStr

    from s2t.backends.scoring.decision_policy import decide

    pipeline = _pipeline()
    spec, session, thresholds = pipeline.spec, pipeline.session, pipeline.thresholds

    class Record(BaseModel):
        request_id: Optional[str] = None
        stream_id: Optional[str] = None
        sequence_id: Optional[int] = None
        features: dict[str, Union[StrictStr, StrictInt, StrictFloat]]

    class Score(BaseModel):
        probability: float
        decision: str

    app = FastAPI()

    @app.get("/health")
    def health():
        return {"ready": True}

    @app.post(ROUTE)
    def score(record: Record) -> Score:
        try:
            categorical = [[f.index_of(str(record.features[f.name])) for f in spec.categorical]]
            numeric = [[float(record.features[name]) for name in spec.numeric]]
        except (KeyError, ValueError) as err:
            raise HTTPException(status_code=400, detail=f"features: {err}") from None
        (probability,) = session.run(None, {"categorical": np.array(categorical, dtype=np.int64),
                                            "numeric": np.array(numeric, dtype=np.float32)})
        return Score(probability=float(probability[0, 0]), decision=decide(probability, thresholds)[0, 0].decode())

    return app


@dataclass
class BaselineServer:
    """One of the apps as a subprocess on a free port; `start()` returns once both workers answer."""

    model: Path
    pipeline_config: Path  # risk_pipeline's model folder: its config holds the thresholds
    port: int
    app: str = "baseline"
    workers: int = 2
    log_path: Path | None = None
    process: subprocess.Popen | None = None
    startup_seconds: float = field(default=float("nan"))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "uvicorn", "--factory", APPS[self.app], "--host", "127.0.0.1",
                "--port", str(self.port), "--workers", str(self.workers), "--loop", "uvloop", "--http", "httptools",
                "--log-level", "warning", "--no-access-log"]

    def start(self, timeout: float = 60.0) -> "BaselineServer":
        env = dict(os.environ, **{MODEL_ENV: str(Path(self.model).resolve()),
                                  PIPELINE_ENV: str(Path(self.pipeline_config).resolve())})
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        started = time.monotonic()
        self.process = subprocess.Popen(self.command(), env=env, stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
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

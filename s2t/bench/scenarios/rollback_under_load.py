"""Rollback under load, as an operator runs it: `s2t rollback` launched on an explicit-mode server that takes the
admin key, while gRPC callers keep risk_pipeline saturated.

Each swap publishes a scorer whose probability is shifted (so that the two versions answer differently), waits
until risk_pipeline serves it, then launches `s2t rollback` and times two clocks from the launch: until the
command is back, and until a probe's records come back with the previous version's scores (in force). The load is
CALLERS tritonclient gRPC callers, each with one record in flight at all times, counting its own answers and
failures: Triton's statistics start again from zero when a model reloads, and h2load sees HTTP statuses only (a
gRPC error travels in the trailers).
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from s2t.triton_admin import ADMIN_KEY_ENV
from s2t.wire.names import PAYLOAD, PIPELINE, PROBABILITY, SCORER

CALLERS = 4
# Added to the shifted version's probability: far above the 1e-5 the versions' answers are compared within.
SHIFT = 0.05
PROBE_RECORDS = 20
# A version that never comes into force is a result (None), not a hung benchmark.
IN_FORCE_LIMIT_S = 60.0


def shifted_model(source: Path, out: Path, shift: float = SHIFT) -> Path:
    """The same model with `shift` added to its probability (clipped to [0, 1]): a version that scores differently."""
    import onnx
    from onnx import helper

    model = onnx.load(str(source))
    graph = model.graph
    producer = next(n for n in graph.node if "probability" in n.output)
    producer.output[list(producer.output).index("probability")] = "probability_unshifted"
    graph.initializer.extend([helper.make_tensor("shift", onnx.TensorProto.FLOAT, [], [shift]),
                              helper.make_tensor("zero", onnx.TensorProto.FLOAT, [], [0.0]),
                              helper.make_tensor("one", onnx.TensorProto.FLOAT, [], [1.0])])
    graph.node.extend([helper.make_node("Add", ["probability_unshifted", "shift"], ["probability_shifted"]),
                       helper.make_node("Clip", ["probability_shifted", "zero", "one"], ["probability"])])
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(out))
    return out


@dataclass(frozen=True)
class Swap:
    version: int  # the shifted version published, then rolled back
    publish_s: float  # publish() until it returned (the new version loaded)
    rollback_s: float  # `s2t rollback`'s launch until it exited
    in_force_s: float | None  # the same launch until the probe got the previous version's scores


class _Probe:
    """risk_pipeline's probabilities for the same records, asked again and again over gRPC."""

    def __init__(self, grpc_url: str, records: list[bytes]):
        import tritonclient.grpc as grpc

        self.client = grpc.InferenceServerClient(grpc_url)
        self.inputs = [grpc.InferInput(PAYLOAD, [len(records), 1], "BYTES")]
        self.inputs[0].set_data_from_numpy(np.array([[r] for r in records], dtype=object))

    def scores(self) -> np.ndarray:
        return self.client.infer(PIPELINE, self.inputs).as_numpy(PROBABILITY).ravel()

    def until(self, expected: np.ndarray, began: float, limit_s: float = IN_FORCE_LIMIT_S) -> float | None:
        """Seconds from `began` until the answers equal `expected`, or None past `limit_s`."""
        while time.monotonic() - began < limit_s:
            if np.allclose(self.scores(), expected, atol=1e-5):
                return time.monotonic() - began
        return None

    def close(self) -> None:
        self.client.close()


class _Callers:
    """`count` callers on risk_pipeline, one record each in flight, until stopped; every failure is kept."""

    def __init__(self, grpc_url: str, record: bytes, count: int):
        self.grpc_url, self.record = grpc_url, record
        self.answered, self.failures = [0] * count, []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._call, args=(n,), daemon=True) for n in range(count)]

    def __enter__(self) -> "_Callers":
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def _call(self, n: int) -> None:
        import tritonclient.grpc as grpc

        client = grpc.InferenceServerClient(self.grpc_url)
        inputs = [grpc.InferInput(PAYLOAD, [1, 1], "BYTES")]
        inputs[0].set_data_from_numpy(np.array([[self.record]], dtype=object))
        try:
            while not self._stop.is_set():
                try:
                    client.infer(PIPELINE, inputs)
                    self.answered[n] += 1
                except Exception as err:  # noqa: BLE001 - every failure is a result
                    self.failures.append(str(err)[:300])
        finally:
            client.close()


def _rollback_command(repository: Path, consumers: tuple[Path, ...], http_url: str) -> list[str]:
    return [str(Path(sys.executable).parent / "s2t"), "rollback", SCORER, "--yes", "--repository", str(repository),
            *[arg for c in consumers for arg in ("--consumer-repository", str(c))], "--http-url", http_url]


def run(http_url: str, grpc_url: str, key: str, repository: Path, consumers: tuple[Path, ...], scorer_onnx: Path,
        records: list[bytes], swaps: int, work: Path, log=print) -> dict:
    """`swaps` publish + rollback pairs under CALLERS gRPC callers on a server in explicit mode with admin key `key`
    (the repositories it serves: `repository`, holding the scorer, and `consumers`)."""
    shifted = shifted_model(scorer_onnx, work / "shifted.onnx")
    probe = _Probe(grpc_url, records[:PROBE_RECORDS])
    try:
        original = probe.scores()
        with _Callers(grpc_url, records[0], CALLERS) as load:
            began = time.monotonic()
            time.sleep(1.0)
            done = [_swap(http_url, key, repository, consumers, shifted, probe, original, log) for _ in range(swaps)]
            seconds = time.monotonic() - began
    finally:
        probe.close()
    answered = sum(load.answered)
    return {"callers": CALLERS, "model_control_mode": "explicit", "admin_key": True,
            "clock": "s2t rollback's launch", "swaps": [asdict(s) for s in done], "errors": len(load.failures),
            "failures": sorted(set(load.failures))[:5], "answered": answered,
            "requests_per_s": answered / seconds if seconds > 0 else float("nan")}


def _swap(http_url: str, key: str, repository: Path, consumers: tuple[Path, ...], shifted: Path, probe: _Probe,
          original: np.ndarray, log) -> Swap:
    from s2t.control.publish import publish

    began = time.monotonic()
    version = publish(SCORER, shifted, repository, None, consumer_repositories=consumers, url=http_url, key=key)
    published = time.monotonic() - began
    if probe.until(np.clip(original + SHIFT, 0, 1), time.monotonic()) is None:
        raise RuntimeError(f"risk_pipeline never served the published {SCORER} version {version}")
    launched = time.monotonic()
    command = subprocess.Popen(_rollback_command(repository, consumers, http_url), env={**os.environ, ADMIN_KEY_ENV: key},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # The command's own clock runs on a thread of its own, so that it stops when the command exits, whether the
    # probe saw the previous version before or after.
    exit_ = {}
    waiter = threading.Thread(target=lambda: exit_.update(output=command.communicate(timeout=120),
                                                         at=time.monotonic()))
    waiter.start()
    in_force = probe.until(original, launched)
    waiter.join()
    if "at" not in exit_ or command.returncode != 0:
        if command.poll() is None:  # past communicate's 120 s
            command.kill()
            command.wait()
        output = "".join(exit_.get("output", ("", "")))
        raise RuntimeError(f"s2t rollback exited {command.returncode}: {output[-2000:]}")
    rollback_s = exit_["at"] - launched
    log(f"rollback under load: version {version} rolled back, in force after "
        f"{'never' if in_force is None else f'{in_force:.2f} s'}, the command back after {rollback_s:.2f} s")
    return Swap(version, published, rollback_s, in_force)

"""Shared memory (system and CUDA), logging and trace answer only holders of the admin key, on HTTP and gRPC, on the
real tritonserver however it is started; scoring traffic beside a client probing them is unaffected."""
from __future__ import annotations

import json
import os
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpc
import tritonclient.http as http
from tritonclient.utils import InferenceServerException

from s2t.control.live_control import admin_headers
from tests.integration.servers import EXPLICIT_ADMIN_KEY as KEY

PROTOCOLS = {"http": (http, "http_url"), "grpc": (grpc, "grpc_url")}
# Triton's gRPC endpoint expects the restricted-protocol header with this prefix.
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"


def key_headers(protocol: str) -> dict[str, str]:
    return {(GRPC_HEADER_PREFIX if protocol == "grpc" else "") + name: value
            for name, value in admin_headers(KEY).items()}


def restricted_calls(client, shm_key: str = "/s2t_no_such_region"):
    """Each restricted category once, by name: (what, call taking headers)."""
    return [
        ("system shared memory", lambda h: client.register_system_shared_memory("s2t_probe", shm_key, 64, headers=h)),
        ("CUDA shared memory", lambda h: client.register_cuda_shared_memory("s2t_probe", b"AAAA", 0, 64, headers=h)),
        ("log settings", lambda h: client.update_log_settings({"log_verbose_level": 1}, headers=h)),
        ("log settings read", lambda h: client.get_log_settings(headers=h)),
        ("trace settings", lambda h: client.update_trace_settings(settings={"trace_rate": "1"}, headers=h)),
        ("trace settings read", lambda h: client.get_trace_settings(headers=h)),
    ]


def client_for(server, protocol: str):
    module, url = PROTOCOLS[protocol]
    return module.InferenceServerClient(getattr(server, url))


class ScoringTraffic:
    """risk_pipeline requests over HTTP, one after another, while the test runs: every one must be answered."""

    def __init__(self, server, records, limit_s: float = 60.0):
        self.server, self.records, self.limit_s = server, records, limit_s
        self.answers, self.failures = [], []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        client = http.InferenceServerClient(self.server.http_url, network_timeout=60)
        deadline = time.monotonic() + self.limit_s
        try:
            for i in range(2000):
                if self.stop.is_set() or time.monotonic() > deadline:
                    break
                payload = http.InferInput("payload", [1, 1], "BYTES")
                record = {"features": self.records[i % len(self.records)]}
                payload.set_data_from_numpy(np.array([[json.dumps(record).encode()]], dtype=object))
                try:
                    result = client.infer("risk_pipeline", [payload])
                    self.answers.append((float(result.as_numpy("probability")[0, 0]),
                                         result.as_numpy("decision")[0, 0]))
                except InferenceServerException as err:
                    self.failures.append(str(err))
        finally:
            client.close()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(self.limit_s + 30)
        assert not self.failures, self.failures[:3]
        assert self.answers, "no scoring request was answered"
        assert all(0.0 <= p <= 1.0 and d in (b"APPROVE", b"REVIEW", b"DECLINE") for p, d in self.answers)


def refused(call, headers) -> str:
    with pytest.raises(InferenceServerException) as caught:
        call(headers)
    return str(caught.value)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_without_a_configured_key_nobody_reaches_shared_memory_logging_or_trace(triton, protocol,
                                                                                 german_credit_data):
    client = client_for(triton, protocol)
    try:
        with ScoringTraffic(triton, german_credit_data.records()[:50]):
            for _ in range(20):
                for what, call in restricted_calls(client):
                    for headers in ({}, {"admin-key": ""}, {"admin-key": "guess"}):
                        assert "restricted" in refused(call, headers), (what, headers)
    finally:
        client.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_only_the_holder_of_the_key_reaches_shared_memory_logging_and_trace(triton_explicit, protocol,
                                                                            german_credit_data):
    from tritonclient.utils import shared_memory as shm
    client = client_for(triton_explicit, protocol)
    region = shm.create_shared_memory_region(f"s2t_probe_{protocol}", f"/s2t_probe_{protocol}_{os.getpid()}", 64)
    try:
        with ScoringTraffic(triton_explicit, german_credit_data.records()[:50]):
            for what, call in restricted_calls(client, f"/s2t_probe_{protocol}_{os.getpid()}"):
                for headers in ({}, {"admin-key": "guess"}, {"other-header": KEY}):
                    assert "restricted" in refused(call, headers), (what, headers)
            key = key_headers(protocol)
            client.register_system_shared_memory("s2t_probe", f"/s2t_probe_{protocol}_{os.getpid()}", 64,
                                                 headers=key)
            assert "s2t_probe" in str(client.get_system_shared_memory_status(headers=key))
            client.unregister_system_shared_memory("s2t_probe", headers=key)
            client.update_log_settings({"log_verbose_level": 0}, headers=key)
            assert client.get_trace_settings(headers=key)
            # The repository API too: its index answers the key only.
            assert "restricted" in refused(lambda h: client.get_model_repository_index(headers=h), {})
            assert client.get_model_repository_index(headers=key)
    finally:
        shm.destroy_shared_memory_region(region)
        client.close()

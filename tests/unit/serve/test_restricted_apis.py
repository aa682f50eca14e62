"""s2t/serve/restricted_apis.py: every tritonserver command comes out with shared memory, logging and trace behind
a key on HTTP and gRPC, and the repository API too when a key is configured."""
from __future__ import annotations

import pytest

from s2t.control.live_control import ADMIN_HEADER
from s2t.serve.keeper import restricted_headers
from s2t.serve.restricted_apis import ALWAYS, HEADER, OPTIONS, WITH_KEY, parse, restrict

HTTP, GRPC = OPTIONS


def restrictions(command: list[str]) -> dict[str, list[tuple[list[str], str, str]]]:
    return {option: [parse(arg[len(option):]) for arg in command if arg.startswith(option)] for option in OPTIONS}


def test_the_header_is_the_one_the_control_commands_send():
    assert HEADER == ADMIN_HEADER


@pytest.mark.parametrize("key", [None, "s3cret"])
def test_a_command_without_restrictions_gets_one_per_protocol(key):
    command = restrict(["tritonserver", "--model-repository=/m"], key)
    assert command[:2] == ["tritonserver", "--model-repository=/m"]
    for option, found in restrictions(command).items():
        assert len(found) == 1, option
        categories, header, value = found[0]
        assert categories == list(WITH_KEY if key else ALWAYS) and header == HEADER
        assert value == key if key else len(value) >= 32


def test_without_a_key_each_start_locks_with_a_different_unguessable_key():
    first, second = (restrictions(restrict(["tritonserver"]))[HTTP][0][2] for _ in range(2))
    assert first != second


@pytest.mark.parametrize("given, key, expected", [
    # The manifests' form: the repository API with the key; the rest is added to the same option.
    ("model-repository:admin-key=K", None, (["model-repository", *ALWAYS], "admin-key", "K")),
    ("model-repository:admin-key=K", "K", (["model-repository", *ALWAYS], "admin-key", "K")),
    # Already complete: left as it is.
    ("trace,model-repository,logging,shared-memory:h=K", None,
     (["trace", "model-repository", "logging", "shared-memory"], "h", "K")),
    # Other categories the operator restricted stay restricted.
    ("statistics:admin-key=K", None, (["statistics", *ALWAYS], "admin-key", "K")),
])
def test_categories_are_added_to_the_option_already_there(given, key, expected):
    command = restrict(["tritonserver", HTTP + given, GRPC + given], key)
    assert restrictions(command) == {HTTP: [expected], GRPC: [expected]}


def test_a_key_referenced_in_a_manifest_keeps_its_reference_and_guards_the_other_protocol_too():
    command = restrict(["tritonserver", HTTP + "model-repository:admin-key=$(S2T_ADMIN_KEY)"])
    expected = [(["model-repository", *ALWAYS], "admin-key", "$(S2T_ADMIN_KEY)")]
    assert restrictions(command) == {HTTP: expected, GRPC: [(list(WITH_KEY), "admin-key", "$(S2T_ADMIN_KEY)")]}


def test_the_supervisor_sends_the_key_only_where_the_repository_api_needs_it():
    locked = restrict(["tritonserver"])
    assert restricted_headers(locked) == {}
    assert restricted_headers(restrict(["tritonserver"], "s3cret")) == {HEADER: "s3cret"}

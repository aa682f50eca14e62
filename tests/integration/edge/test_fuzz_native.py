"""The libFuzzer target of the gRPC front's request checks (native/fuzz/), a short run of `make fuzz`: built under
AddressSanitizer and UndefinedBehaviorSanitizer, it runs its seed corpus (the request generators' messages) and
mutations of it for 15 s without a finding."""
from __future__ import annotations

import subprocess

from tests.conftest import ROOT

FUZZ_SECONDS = 15


def test_the_request_checks_survive_a_short_libfuzzer_run():
    run = subprocess.run(["make", "--no-print-directory", "fuzz", f"FUZZ_SECONDS={FUZZ_SECONDS}"], cwd=ROOT,
                         capture_output=True, text=True, timeout=1200)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-6000:]
    assert "Done " in output and "stat::number_of_executed_units" in output, output[-3000:]
    executed = int(output.split("stat::number_of_executed_units:")[1].split()[0])
    assert executed > 1000, output[-3000:]

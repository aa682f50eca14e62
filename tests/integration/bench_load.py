"""What every bench mode's results must say about the machine's load: each measured run watched, and the
publishable flag following the rule (s2t/bench/harness/machine_load.py) from the figures recorded beside it."""
from s2t.bench.harness.machine_load import verdict, RoundLoad


def assert_load_follows_the_rule(results: dict, labels: list[str], printed: str) -> None:
    load = results["load"]
    assert [r["label"] for r in load["rounds"]] == labels
    assert all(r["wall_seconds"] > 0 and 0 <= r["other_cpu_share"] <= 1 for r in load["rounds"])
    rounds = [RoundLoad(r["label"], r["wall_seconds"], r["machine_cpu_seconds"], r["own_cpu_seconds"], r["cores"],
                        r.get("other_process_cpu_seconds")) for r in load["rounds"]]
    expected = verdict(load["load_average_1m_at_start"], load["cores"], rounds)
    assert results["publishable"] is load["publishable"] is expected.publishable
    assert load["reasons"] == list(expected.reasons)
    busy = not expected.publishable
    assert ("**NOT PUBLISHABLE: taken on a busy machine.**" in printed) is busy
    assert ("**Publishable**" in printed) is not busy

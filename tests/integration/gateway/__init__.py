"""Integration tests: s2t/gateway/ and s2t/legacy/: the legacy protocol, its limits, the dual-run."""

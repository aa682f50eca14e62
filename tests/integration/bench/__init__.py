"""Integration tests: s2t/bench/: every mode on a short plan."""

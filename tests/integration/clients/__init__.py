"""Integration tests: s2t/clients/."""

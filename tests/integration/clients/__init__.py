"""Integration tests: clients/."""

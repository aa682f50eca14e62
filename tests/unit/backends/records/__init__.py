"""Unit tests of backends/records/."""

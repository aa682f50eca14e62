"""Unit tests of backends/scoring/."""

"""Unit tests of backends/routing/."""

"""Unit tests of backends/streaming/."""

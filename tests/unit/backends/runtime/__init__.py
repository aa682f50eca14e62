"""Unit tests of backends/runtime/."""

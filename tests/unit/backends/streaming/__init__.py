"""Unit tests of s2t/backends/streaming/."""

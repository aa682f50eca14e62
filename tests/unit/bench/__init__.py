"""Unit tests of s2t/bench/."""

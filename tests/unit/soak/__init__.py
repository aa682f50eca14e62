"""Unit tests of s2t/soak/."""

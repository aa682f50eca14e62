"""Unit tests of s2t/cli/."""

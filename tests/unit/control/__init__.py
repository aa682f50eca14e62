"""Unit tests of s2t/control/."""

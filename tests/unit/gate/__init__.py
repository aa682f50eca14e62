"""Unit tests of s2t/gate/."""

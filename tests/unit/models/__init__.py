"""Unit tests of s2t/models/."""

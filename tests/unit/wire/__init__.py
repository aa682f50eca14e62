"""Unit tests of s2t/wire/."""

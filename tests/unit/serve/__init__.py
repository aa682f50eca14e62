"""Unit tests of s2t/serve/."""

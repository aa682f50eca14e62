"""Unit tests of s2t/gateway/."""

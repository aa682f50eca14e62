"""Unit tests of s2t/clients/."""

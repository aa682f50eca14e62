"""Unit tests of s2t/backends/, by subpackage."""

"""Unit tests of backends/, by subpackage."""

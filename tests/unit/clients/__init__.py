"""Unit tests of clients/."""

"""Unit tests of backends/llm/."""

"""Clients of the served models."""

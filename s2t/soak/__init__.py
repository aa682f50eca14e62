"""Soaks, the reliability gate: a fixed rate for minutes watching memory (supervised), and the hostile soak (hostile/)."""

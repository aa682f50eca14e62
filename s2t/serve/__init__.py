"""Serving: the embedded tritonserver, the keeper and supervisor that heal it, service processes. Standard library only where the keeper runs (the NGC image)."""

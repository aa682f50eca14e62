"""risk_stream: the reorder buffer, the session and its upkeep."""

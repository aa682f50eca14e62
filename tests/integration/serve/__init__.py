"""Integration tests: s2t serve: the supervisor, the gRPC front, lifecycles, clean stops, the soak, observability."""

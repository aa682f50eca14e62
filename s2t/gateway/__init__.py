"""The legacy Skill gRPC service in front of Triton: the gateway, its call admission, its calls to Triton, and the
dual-run against the legacy service."""

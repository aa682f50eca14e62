"""Releasing and control: publishing versions, staged rollouts, the primary, rollbacks, release bundles, status."""

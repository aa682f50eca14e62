"""risk_router: routing policy and core, the circuit breaker, its metrics and the drift watch."""

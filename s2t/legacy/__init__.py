"""The processes that speak the legacy wire protocol (s2t/wire/skill.proto), apart from Triton's serving
(s2t/serve/): the legacy service itself (service.py), the gateway that answers its callers from Triton (gateway.py,
triton_infer.py) and the dual-run that compares the two (dual_run.py)."""

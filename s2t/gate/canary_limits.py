"""What an automatic canary step may show before it is rolled back (`s2t canary --auto`): the defaults the command
line shows and the analysis judges with, in one place. Pure data: the command line imports it at start."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Limits:
    max_shadow_mean_diff: float = 0.01
    max_error_rate: float = 0.01
    max_p99_seconds: float = 0.25
    max_psi: float = 0.25
    min_rows: int = 30  # candidate records per step before anything is judged
    min_psi_rows: int = 200  # below this PSI is mostly sampling noise (about bins/rows), so it is not judged
    max_extensions: int = 3

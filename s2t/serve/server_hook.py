"""The library preloaded into every tritonserver `s2t serve` starts (native/grpc_front_hook.c, built by `make
native`): it starts the public fronts inside Triton's process where asked (grpc_front.in_process_env), and it guards
Triton 2.51's front ends against a request that would kill the server whichever front answers it: the
classification of a BYTES output (SIGFPE in 2.51, refused with INVALID_ARGUMENT instead, as later releases do).
A tritonserver is never started without it."""
from __future__ import annotations

import os
from pathlib import Path

from s2t.errors import S2TError

HOOK = Path(__file__).resolve().parent / "native" / "libs2t_grpc_front_hook.so"
BUILD_HINT = "`make native` builds it (native/build_grpc_front.sh alone)"
# What LD_PRELOAD held besides the hook: the hook puts it back at once, so Triton's children start without the hook.
PRELOAD_REST = "S2T_GRPC_FRONT_PRELOAD_REST"


class ServerHookError(S2TError, RuntimeError):
    pass


def preloaded(env: dict[str, str], hook: Path | None = None) -> dict[str, str]:
    """`env` with the hook first on LD_PRELOAD (a missing build, or a path LD_PRELOAD cannot name, is refused)."""
    hook = hook or HOOK
    if not hook.is_file():
        raise ServerHookError(f"tritonserver's hook {hook} is not built: {BUILD_HINT}")
    if any(c in str(hook) for c in (":", " ")):  # LD_PRELOAD splits on both
        raise ServerHookError(f"tritonserver's hook {hook} is in a folder whose path has a ':' or a space, which "
                              "LD_PRELOAD cannot name: install skill2triton elsewhere")
    env = dict(env)
    env[PRELOAD_REST] = env.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = os.pathsep.join(p for p in (str(hook), env.get("LD_PRELOAD")) if p)
    return env

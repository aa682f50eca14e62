"""One closed-loop HTTP JSON load generator for both Triton and the FastAPI baseline: Debian's wrk, with a Lua
script that cycles through the real records and reports its numbers as one JSON line."""
from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

RESULT_PREFIX = "WRK_JSON "

_SCRIPT = r"""
local bodies = {
%(bodies)s
}
local requests_ = {}
local n = 0
function init(args)
  for i, body in ipairs(bodies) do
    requests_[i] = wrk.format("POST", "%(path)s", {["Content-Type"] = "application/json"}, body)
  end
end
function request()
  n = n %% #requests_ + 1
  return requests_[n]
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('%(prefix)s{"requests": %%d, "duration_us": %%d, "non_2xx": %%d, "connect_errors": %%d, '
    .. '"read_errors": %%d, "write_errors": %%d, "timeouts": %%d, "p50_us": %%d, "p90_us": %%d, "p99_us": %%d, '
    .. '"mean_us": %%.1f, "max_us": %%d}\n',
    summary.requests, summary.duration, e.status, e.connect, e.read, e.write, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.mean, latency.max))
end
"""


@dataclass(frozen=True)
class WrkResult:
    requests: int  # responses wrk read, whatever their status
    seconds: float
    errors: int  # non-2xx responses, and connect, read, write errors and timeouts
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    non_2xx: int = 0

    @property
    def answered(self) -> int:
        """Responses with a 2xx status: an error answer is never throughput (a server that refuses fast would
        otherwise look fast)."""
        return max(self.requests - self.non_2xx, 0)

    @property
    def throughput(self) -> float:
        return self.answered / self.seconds if self.seconds > 0 else float("nan")

    def as_dict(self) -> dict:
        return {**asdict(self), "answered": self.answered, "throughput": self.throughput}


def write_script(path: Path, route: str, bodies: list[str]) -> Path:
    def lua_string(text: str) -> str:
        level = "=" * 4
        if f"]{level}]" in text:
            raise ValueError("record contains the Lua long-string terminator")
        return f"[{level}[{text}]{level}]"
    path.write_text(_SCRIPT % {"bodies": ",\n".join(lua_string(b) for b in bodies), "path": route,
                               "prefix": RESULT_PREFIX})
    return path


def parse(output: str) -> WrkResult:
    line = next((ln for ln in output.splitlines() if ln.startswith(RESULT_PREFIX)), None)
    if line is None:
        raise RuntimeError(f"wrk printed no result:\n{output[-2000:]}")
    raw = json.loads(line[len(RESULT_PREFIX):])
    errors = sum(raw[k] for k in ("non_2xx", "connect_errors", "read_errors", "write_errors", "timeouts"))
    return WrkResult(raw["requests"], raw["duration_us"] / 1e6, errors, raw["p50_us"] / 1e3, raw["p90_us"] / 1e3,
                     raw["p99_us"] / 1e3, raw["mean_us"] / 1e3, raw["non_2xx"])


def run(url: str, script: Path, connections: int, seconds: float, threads: int = 2) -> WrkResult:
    """`url` is scheme://host:port; the script carries the route and the bodies."""
    wrk = shutil.which("wrk")
    if wrk is None:
        raise RuntimeError("wrk is not installed (Debian package `wrk`; `make venv` installs it)")
    proc = subprocess.run([wrk, f"-t{min(threads, connections)}", f"-c{connections}", f"-d{max(1, round(seconds))}s",
                           "--timeout", "10s", "-s", str(script), url],
                          capture_output=True, text=True, timeout=seconds + 60)
    if proc.returncode != 0:
        raise RuntimeError(f"wrk failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return parse(proc.stdout)

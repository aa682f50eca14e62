"""`s2t`: the skill2triton command line, one short command per job, grouped by the layer it calls:
models.py and legacy.py (build artifacts), gate.py (parity, configs, the gated publish), control.py and canary.py
(what is served), serve.py (Triton, the legacy gateway), records.py (send records), ops.py (drift, soaks) and
bench.py. Errors become exit codes once, in failures.py."""
from __future__ import annotations

import atexit
import gc
import importlib

import click

from s2t.cli.failures import S2TGroup

# Each command's module, imported when that command runs or a help lists it: a command pays for its own imports
# only (a rollback none of the benchmark's or the server's). tests/unit/cli holds it to every module's COMMANDS.
COMMAND_MODULES = {
    "data": "models", "convert": "models", "spec": "models", "build-trt": "models",
    "legacy": "legacy",
    "parity": "gate", "check-config": "gate", "publish": "gate",
    "promote": "control", "rollback": "control", "status": "control", "release": "control",
    "canary": "canary",
    "serve": "serve", "gateway": "serve",
    "score": "records", "stream": "records",
    "drift": "ops", "soak": "ops",
    "bench": "bench",
}


class CommandsOnDemand(S2TGroup):
    """The `s2t` group, whose commands come from their modules when asked for."""

    def list_commands(self, ctx) -> list[str]:
        return sorted(set(COMMAND_MODULES) | set(self.commands))

    def get_command(self, ctx, name: str):
        if name in COMMAND_MODULES and name not in self.commands:
            for command in importlib.import_module(f"s2t.cli.{COMMAND_MODULES[name]}").COMMANDS:
                self.add_command(command)
        return super().get_command(ctx, name)


@click.group(cls=CommandsOnDemand, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="skill2triton", prog_name="s2t", message="%(prog)s %(version)s")
def main() -> None:
    """Migrate a legacy TensorFlow risk-scoring service onto Triton Inference Server."""


# A command's last moments: the interpreter's final collection walks every object its imports made (Triton's
# protobuf schema, grpc, numpy) to free memory the exit hands back anyway; frozen, they are left to the exit. Most of
# a short command's (a rollback's) teardown.
atexit.register(gc.freeze)

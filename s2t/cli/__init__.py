"""`s2t`: the skill2triton command line, one short command per job, grouped by the layer it calls:
models.py and legacy.py (build artifacts), gate.py (parity, configs, the gated publish), control.py and canary.py
(what is served), serve.py (Triton, the legacy gateway), records.py (send records), ops.py (drift, soaks) and
bench.py. Errors become exit codes once, in failures.py."""
from __future__ import annotations

import click

from s2t.cli import bench, canary, control, gate, legacy, models, ops, records, serve
from s2t.cli.failures import S2TGroup


@click.group(cls=S2TGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="skill2triton", prog_name="s2t", message="%(prog)s %(version)s")
def main() -> None:
    """Migrate a legacy TensorFlow risk-scoring service onto Triton Inference Server."""


for _module in (models, legacy, gate, control, canary, serve, records, ops, bench):
    for _command in _module.COMMANDS:
        main.add_command(_command)

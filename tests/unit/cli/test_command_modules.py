"""The `s2t` group finds each command in its module when asked, and a command imports no other command's module."""
import importlib
import subprocess
import sys

import click

from tests.conftest import ROOT
from s2t.cli import COMMAND_MODULES, main


def test_the_table_names_every_command_of_every_command_module_and_nothing_else():
    modules = sorted(set(COMMAND_MODULES.values()))
    found = {command.name: module for module in modules
             for command in importlib.import_module(f"s2t.cli.{module}").COMMANDS}
    assert found == COMMAND_MODULES


def test_every_command_is_found_under_its_name():
    context = click.Context(main)
    assert main.list_commands(context) == sorted(COMMAND_MODULES)
    assert all(main.get_command(context, name).name == name for name in COMMAND_MODULES)
    assert main.get_command(context, "no-such-command") is None


def test_a_rollback_imports_no_other_commands_module():
    shown = subprocess.run(
        [sys.executable, "-c", "import sys; from s2t.cli import main\n"
                               "try:\n    main(['rollback', '--help'])\nexcept SystemExit:\n    pass\n"
                               "print(' '.join(sorted(m for m in sys.modules if m.startswith('s2t.cli.'))))"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    commands = {m.removeprefix("s2t.cli.") for m in shown.stdout.splitlines()[-1].split()}
    assert commands & set(COMMAND_MODULES.values()) == {"control"}

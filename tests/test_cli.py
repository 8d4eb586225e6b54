"""The command line as a user first meets it: --help."""
import argparse

import pytest

from llama_npu.cli import build_parser

from conftest import run_cli


@pytest.mark.quick
def test_every_option_of_every_command_has_a_help_text():
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    undocumented = {name: [a.dest for a in command._actions if not a.help] for name, command in commands.items()}
    assert {name: dests for name, dests in undocumented.items() if dests} == {}


def test_help_shows_defaults_and_is_written_for_users():
    top = run_cli("--help", check=True).stdout
    assert "Fine-tune Llama 3.2 1B/3B on Chinese data" in top and "typical use:" in top and "exit codes:" in top
    assert "parsing" not in top  # the module docstring is for developers
    ev = " ".join(run_cli("eval", "--help", check=True).stdout.split())
    assert "(default: 2048)" in ev and "(default: auto)" in ev and "(default: None)" not in ev
    prep = " ".join(run_cli("prepare-data", "--help", check=True).stdout.split())
    assert prep.startswith("usage: llama-npu prepare-data") and "(default: error)" in prep

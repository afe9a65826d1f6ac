"""The ``mmgcu`` console script and its parser."""

import os
import subprocess
import sys

import pytest

from mmgcu import __version__
from mmgcu.cli import build_parser, main
from tests.conftest import clean_env


def test_console_script_prints_version():
    exe = os.path.join(os.path.dirname(sys.executable), "mmgcu")
    if not os.path.exists(exe):
        pytest.skip("mmgcu is not installed in this environment (pip install -e .)")
    proc = subprocess.run([exe, "--version"], env=clean_env(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"mmgcu {__version__}"


def test_subcommands_and_defaults():
    parser = build_parser()
    args = parser.parse_args(["check"])
    assert (args.cards, args.steps, args.device, args.timeout) == (None, 3, "auto", 300.0)
    assert parser.parse_args(["env", "--json"]).json is True
    args = parser.parse_args(["train", "cfg.py", "4", "--work-dir", "w"])
    assert (args.mode, args.config, args.args) == ("train", "cfg.py", ["4", "--work-dir", "w"])
    args = parser.parse_args(["test", "cfg.py", "c.pth", "--out", "o"])
    assert (args.mode, args.checkpoint, args.args) == ("test", "c.pth", ["--out", "o"])
    assert parser.parse_args(["configs"]).name is None


def test_no_subcommand_prints_help(capsys):
    assert main([]) == 2
    assert "{env,check,train,test,rehearse,configs}" in capsys.readouterr().out

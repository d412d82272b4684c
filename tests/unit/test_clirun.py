"""pipert.clirun.run_cli: a command's status and output, and this process's streams put back."""
import os
import sys

import pytest

from pipert.clirun import run_cli


def _streams() -> tuple:
    return os.fstat(1).st_ino, os.fstat(2).st_ino, sys.stdout, sys.stderr


def test_run_cli_returns_status_and_output_and_restores_the_streams():
    before = _streams()
    ok = run_cli("simulate", "1f1b", "--stages", "2", "--microbatches", "4", "--json")
    assert ok.returncode == 0 and ok.stderr == ""
    assert [(r["schedule"], r["stages"], r["microbatches"]) for r in ok.rows()] == [("1f1b", 2, 4)]
    bad = run_cli("simulate", "1f1b", "--stages", "x")  # argparse's refusal: SystemExit(2)
    assert bad.returncode == 2 and bad.stdout == "" and "--stages" in bad.stderr, bad.stderr
    with pytest.raises(AssertionError, match="exit status 2"):
        bad.rows()
    assert _streams() == before

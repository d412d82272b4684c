"""`--nic-bandwidth` of simulate and compare: the ranks of a node share one NIC (pipert.sim.nic)."""
from __future__ import annotations

import json

import pytest

from pipert.cli import main

TAWPIPE = ["tawpipe", "-P", "4", "-M", "8", "--model", "1b", "--ranks-per-node", "2"]


def _makespan(capsys, argv: list[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_a_small_shared_nic_slows_weight_passing_and_is_reported(capsys):
    own = _makespan(capsys, ["simulate", *TAWPIPE, "--json"])
    shared = _makespan(capsys, ["simulate", *TAWPIPE, "--nic-bandwidth", "10Gbps", "--json"])
    assert own["nic_bandwidth_Bps"] is None and shared["nic_bandwidth_Bps"] == 1.25e9
    assert shared["makespan"] > own["makespan"]
    # a NIC as fast as the node's two default 200 Gbit/s links changes nothing
    wide = _makespan(capsys, ["simulate", *TAWPIPE, "--nic-bandwidth", "400Gbps", "--json"])
    assert wide["makespan"] == pytest.approx(own["makespan"])
    assert main(["simulate", *TAWPIPE, "--nic-bandwidth", "10Gbps"]) == 0
    assert "shared NIC    10 Gbit/s each way per node of 2 ranks" in capsys.readouterr().out
    rows = _makespan(capsys, ["compare", "-P", "4", "-M", "8", "--model", "1b", "--ranks-per-node", "2",
                              "--schedules", "tawpipe", "--nic-bandwidth", "10Gbps", "--json", "--plot", ""])
    assert rows[0]["makespan"] == pytest.approx(shared["makespan"])
    assert main(["compare", *TAWPIPE[1:], "--schedules", "tawpipe", "--nic-bandwidth", "10Gbps", "--plot", ""]) == 0
    assert "shared NIC: 10 Gbit/s" in capsys.readouterr().out


@pytest.mark.parametrize("argv,needle", [
    (["simulate", "tawpipe", "--ranks-per-node", "2", "--nic-bandwidth", "10Gbps"], "give --model too"),
    (["simulate", "tawpipe", "--model", "1b", "--nic-bandwidth", "10Gbps"], "give --ranks-per-node as well"),
    (["simulate", *TAWPIPE, "--nic-bandwidth", "10"], "--nic-bandwidth '10' has no unit"),
    (["compare", "--model", "1b", "--ranks-per-node", "2", "--nic-bandwidth", "0Gbps"], "must be > 0"),
])
def test_bad_nic_flag_is_refused(argv, needle, capsys):
    assert main(argv) == 2
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize("command", ["export", "emulate"])
def test_commands_without_a_shared_nic_do_not_take_the_flag(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "tawpipe", "--nic-bandwidth", "10Gbps"])
    assert "unrecognized arguments: --nic-bandwidth" in capsys.readouterr().err

"""pipert simulate / compare --tp T [--sp]: TP collectives priced inside the computes on the
intra-node link, boundary messages 1/T under SP, bad input refused naming the flag."""
from __future__ import annotations

import json

import pytest

from pipert.cli import main

SEVEN_B = ("-P", "4", "-M", "8", "--model", "7b", "--seq", "2048")


def _sim(capsys, *argv: str) -> dict:
    assert main(["simulate", "1f1b", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_simulate_tp_divides_compute_and_sp_divides_boundary_messages(capsys):
    nodes = ("--ranks-per-node", "8")                    # one pipeline rank of 8 devices per node
    one = _sim(capsys, *SEVEN_B, "--ranks-per-node", "1")
    tp = _sim(capsys, *SEVEN_B, "--tp", "8", *nodes)
    sp = _sim(capsys, *SEVEN_B, "--tp", "8", "--sp", *nodes)
    assert (tp["tp"], tp["sp"], sp["sp"]) == (8, False, True)
    # the boundary activation: whole [s, b, h] per device without SP, the 1/T sequence shard with it
    assert tp["comm_bytes"]["inter_node"] == one["comm_bytes"]["inter_node"]
    assert sp["comm_bytes"]["inter_node"] == pytest.approx(one["comm_bytes"]["inter_node"] / 8, rel=1e-12)
    # computes shrink by about T (collectives added), activations by about T under SP only
    assert one["makespan"] / 8 < tp["makespan"] < one["makespan"] / 2
    assert sp["peak_memory"][0] < tp["peak_memory"][0] / 2


def test_simulate_tp_groups_per_node(capsys):
    """--ranks-per-node counts devices: 16 devices of T = 8 hold 2 pipeline ranks, so of 4 ranks
    the middle pair crosses nodes and the others stay inside."""
    out = _sim(capsys, *SEVEN_B, "--tp", "8", "--sp", "--ranks-per-node", "16")
    per_node = _sim(capsys, *SEVEN_B, "--tp", "8", "--sp", "--ranks-per-node", "8")
    assert out["comm_bytes"]["intra_node"] > 0 and out["comm_bytes"]["inter_node"] > 0
    assert out["comm_bytes"]["inter_node"] == pytest.approx(per_node["comm_bytes"]["inter_node"] / 3)


def test_compare_takes_tp(capsys):
    assert main(["compare", *SEVEN_B, "--tp", "4", "--sp", "--schedules", "1f1b,gpipe", "--plot", ""]) == 0
    out = capsys.readouterr().out
    assert "T=4 SP" in out and "1f1b" in out and "skipped" not in out


@pytest.mark.parametrize("argv,message", [
    (("--tp", "8"), "--tp 8 prices tensor parallelism with the analytic model"),
    (("--sp",), "--sp prices tensor parallelism with the analytic model"),
    (("--model", "7b", "--sp"), "--sp shards the sequence over the tensor-parallel group, but --tp is 1"),
    (("--model", "7b", "--tp", "0"), "--tp must be >= 1, got 0"),
    (("--model", "7b", "--tp", "3"), "--tp 3: T=3 does not divide the model's heads=32 of --model 7b; allowed --tp: "
                                     "1, 2, 4, 8, 16, 32"),
    (("--model", "70b", "--tp", "16"), "T=16 does not divide the model's kv_heads=8"),
    (("--model", "7b", "--tp", "2", "--sp", "--seq", "4095"), "T=2 does not divide the model's seq=4095"),
    (("--model", "7b", "--tp", "16", "--ranks-per-node", "8"), "--tp 16: a tensor-parallel group lies inside one "
                                                               "node, and T=16 devices do not fit a node of "
                                                               "--ranks-per-node 8 devices in whole groups; allowed "
                                                               "--tp: 1, 2, 4, 8"),
    (("--model", "7b", "--tp", "8", "--ranks-per-node", "12"), "--ranks-per-node 12 devices in whole groups; "
                                                               "allowed --tp: 1, 2, 3, 4, 6, 12"),
    (("--model", "7b", "--tp", "2", "--ranks-per-node", "6"), "--ranks-per-node 6 (--tp 2: 3 pipeline ranks of 2 "
                                                              "devices per node) does not divide the 4 pipeline "
                                                              "ranks"),
])
@pytest.mark.parametrize("command", ["simulate", "compare"])
def test_bad_tp_flags_are_named(capsys, command, argv, message):
    head = ["simulate", "1f1b"] if command == "simulate" else ["compare", "--plot", ""]
    assert main([*head, *argv]) == 2
    assert message in capsys.readouterr().err


def test_helixpipe_paper_configuration(capsys):
    """HelixPipe's runs: one stage per node of 8 GPUs with Megatron SP of 8, m = 2p, micro-batch 1,
    the GPT-3-style 7B at 128k tokens (here P = 2 to stay fast)."""
    argv = ["helixpipe-2fold", "-P", "2", "-M", "4", "--model", "gpt-7b", "--seq", "131072", "--micro-batch-size",
            "1", "--device", "h20", "--tp", "8", "--sp", "--ranks-per-node", "8", "--json"]
    assert main(["simulate", *argv]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["units"] == 65 and out["tp"] == 8 and out["sp"]
    assert out["comm_bytes"]["intra_node"] == 0 and out["comm_bytes"]["inter_node"] > 0


def test_node_links_price_messages_and_collectives(capsys):
    base = (*SEVEN_B, "--tp", "8", "--sp", "--ranks-per-node", "8")
    plain = _sim(capsys, *base)
    slow_nic = _sim(capsys, *base, "--node-bandwidth", "10Gbps", "--node-latency", "1ms")
    slow_nvlink = _sim(capsys, *base, "--intra-node-bandwidth", "20GB/s")
    assert slow_nic["makespan"] > plain["makespan"] and slow_nvlink["makespan"] > plain["makespan"]
    assert slow_nic["comm_bytes"] == plain["comm_bytes"] == slow_nvlink["comm_bytes"]


@pytest.mark.parametrize("argv,message", [
    (("--node-bandwidth", "100Gbps"), "--node-bandwidth 100Gbps sets a link of the analytic model"),
    (("--intra-node-bandwidth", "1GB/s"), "--intra-node-bandwidth 1GB/s sets a link of the analytic model"),
    (("--model", "7b", "--node-latency", "5us"), "--node-latency 5us describes the link between nodes: give "
                                                 "--ranks-per-node as well"),
    (("--model", "7b", "--ranks-per-node", "2", "--node-bandwidth", "100"), "--node-bandwidth '100' has no unit"),
    (("--model", "7b", "--intra-node-bandwidth", "0GB/s"), "--intra-node-bandwidth '0GB/s' must be > 0"),
])
def test_bad_node_link_flags_are_named(capsys, argv, message):
    assert main(["simulate", "1f1b", *argv]) == 2
    assert message in capsys.readouterr().err


def test_pipemesh_paper_configuration(capsys):
    """PipeMesh's GPT-3 58B on A100 (Table IV: T, P, D = 8, 3, 3; 12 micro-batches per pipeline, M = 6
    chunks per stage; 400 Gb/s per node of 8 GPUs): one pipeline of it."""
    assert main(["simulate", "pipemesh", "-P", "3", "-V", "6", "-M", "12", "--model", "gpt3-58b", "--device", "a100",
                 "--tp", "8", "--sp", "--ranks-per-node", "8", "--node-bandwidth", "50Gbps", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["units"] == 18 and out["tp"] == 8 and out["comm_bytes"]["inter_node"] > 0

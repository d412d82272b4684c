"""Every flag of train, simulate, emulate and compare is checked before any work: the command
fails at once with the flag's name, its value and what is allowed. Each case runs the command
line's ``main`` in this process (a missed check would start the work: ranks, a long
simulation); one case runs ``python -m pipert.cli`` in a subprocess, the way a user does (its
timeout is a generous bound for a shared machine, not a timing assertion)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CASES = [
    (["train", "--stages", "100000"], "--stages 100000 x 1 chunks of 1f1b = 100000 units, but model 'tiny' has 4 "
                                      "layers"),
    (["train", "-P", "6"], "--stages 6 x 1 chunks of 1f1b = 6 units, but model 'tiny' has 4 layers"),
    (["train", "-M", "3"], "--batch-size 16 is not divisible into 3 micro-batches; use a multiple of 3"),
    (["train", "--schedule", "interleaved-1f1b", "--stages", "4"], "--stages 4 x 2 chunks of interleaved-1f1b = 8 "
                                                                   "units"),
    (["train", "--seq", "100000"], "--seq 100000 exceeds the 128 positions of model 'tiny'; allowed: 1..128"),
    (["train", "--seed", "-1"], "--seed must be >= 0, got -1"),
    (["train", "--tp", "3"], "--tp 3 must divide heads=4, kv_heads=2, ffn=176, vocab=256 (LlamaConfig); allowed "
                             "--tp: 1, 2"),
    (["train", "--tp", "2", "--backend", "local"], "--tp 2: --backend local not supported with tensor parallelism "
                                                  "yet"),
    (["train", "--steps", "0"], "--steps must be >= 1, got 0"),
    (["train", "--model", "huge"], "--model 'huge' unknown; allowed: tiny, small"),
    (["train", "--model", "layers=4,hidden=64"], "--model: model 'layers=4,hidden=64': give heads too"),
    (["train", "--model", "layers=4,hidden=64,heads=4,depth=2"], "'depth=2' is not size=positive integer (each "
                                                                 "once); allowed sizes: layers, hidden, heads"),
    (["train", "--model", "layers=4,hidden=64,heads=4,kv_heads=3"], "--model: LlamaConfig: kv_heads=3 must divide "
                                                                    "heads=4"),
    (["train", "--schedule", "zb-v", "--chunks", "3"], "--schedule zb-v --stages 4 --microbatches 8 (per replica) "
                                                       "--chunks 3: zb-v needs chunks == 2 (got V=3)"),
    (["simulate", "zb-v", "-V", "3"], "zb-v --stages 4 --microbatches 8 --chunks 3: zb-v needs chunks == 2"),
    (["train", "--lr", "inf"], "--lr must be a finite number > 0, got inf"),
    (["train", "--dtype", "int8"], "--dtype 'int8' unknown; allowed: float32, float64, bfloat16"),
    (["train", "--schedule", "nope"], "unknown schedule 'nope'; available: gpipe, 1f1b"),
    (["simulate", "1f1b", "--tf", "-1"], "--tf must be a finite number > 0, got -1.0"),
    (["simulate", "1f1b", "--tb", "2ms"], "argument --tb: '2ms': uniform costs are bare numbers in one time unit, "
                                          "that of --tf (e.g. 2); for costs in seconds give --model instead"),
    (["compare", "--tf", "1s"], "argument --tf: '1s': uniform costs are bare numbers"),
    (["simulate", "1f1b", "--dcs", "2", "--dc-latency", "-2"], "--dc-latency must be a finite number >= 0, got -2.0"),
    (["simulate", "1f1b", "-P", "4", "--dcs", "3"], "--dcs 3 does not divide the 4 stages into equal blocks"),
    (["simulate", "1f1b", "--memory-limit", "0"], "--memory-limit must be a finite number > 0, got 0.0"),
    (["simulate", "1f1b", "--model", "7b", "--seq", "0"], "--seq must be >= 1, got 0"),
    (["simulate", "1f1b", "--model", "9t"], "--model '9t' unknown; allowed:"),
    (["compare", "-M", "0"], "--microbatches must be >= 1, got 0"),
    (["simulate", "interleaved-1f1b", "--model", "tiny"], "--model tiny has 4 layers, too few for 8 units "
                                                           "(--stages x chunks per stage); allowed: at most 4"),
    (["plan", "--model", "tiny"], "--model tiny has 4 layers, too few for 8 units"),
    (["compare", "--ranks-per-node", "3"], "--ranks-per-node 3 does not divide the 4 ranks of each datacenter"),
    (["train", "--ranks-per-node", "3"], "--ranks-per-node 3 does not divide the 4 ranks of each datacenter; "
                                         "allowed: a divisor of 4"),
    (["emulate", "1f1b", "--real", "--steps", "0"], "--steps must be >= 1, got 0"),
    (["emulate", "1f1b", "--time-unit", "0"], "--time-unit must be a finite time > 0, got '0'"),
    (["emulate", "1f1b", "--real", "--real-model", "huge"], "--real-model 'huge' unknown; allowed: tiny"),
]


@pytest.mark.parametrize("argv,message", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_flag_fails_at_once_naming_it(argv, message, capsys):
    from pipert.cli import main
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own errors
        code = e.code
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    assert message in err, err


def test_the_command_line_fails_with_status_2_and_the_message():
    argv, message = CASES[0]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-m", "pipert.cli", *argv], capture_output=True, text=True, env=env,
                         timeout=60, cwd=ROOT)
    assert out.returncode == 2, (out.stdout[-2000:], out.stderr[-2000:])
    assert message in out.stderr, out.stderr

"""`import pipert` and the planning commands load no heavy library they do not need."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "ortools", "matplotlib", "triton")


def _loaded_after(code: str) -> dict:
    probe = code + f"\nimport json, sys\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_pipert_loads_no_heavy_library():
    assert _loaded_after("import pipert; pipert.Schedule; pipert.build_schedule; pipert.simulate") == []


def test_simulate_compare_and_plan_load_no_heavy_library():
    code = ("from pipert.cli import main\n"
            "main(['simulate', 'zb-v', '-P', '4', '-M', '8', '--json'])\n"
            "main(['compare', '-P', '4', '-M', '8', '--json', '--plot', '', '--schedules', '1f1b,zb-h1,crosspipe-greedy'])\n"
            "main(['plan', '-P', '4', '-M', '8'])")
    assert _loaded_after(code) == []


def test_lazy_export_loads_on_access():
    assert "torch" in _loaded_after("import pipert; pipert.Pipeline")

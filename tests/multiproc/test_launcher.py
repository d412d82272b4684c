"""`pipert train` under torch's elastic agent: stopping the launcher ends its ranks and leaves
nothing behind, a stopped rank ends the job naming it, and torchrun jobs across "nodes" train
exactly."""
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

TIMEOUT = 4  # --timeout of the jobs that are stopped or hang


def _env(tmp_path: Path) -> dict:
    """The job's temporary directory is the test's own (empty) folder; torch's compile cache,
    which any torch program may create there, goes elsewhere."""
    (tmp_path / "tmp").mkdir()
    return {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache")}


@contextlib.contextmanager
def _training(tmp_path: Path, stages: int) -> Iterator[tuple[subprocess.Popen, list[int]]]:
    """A long `pipert train` in its own session (stdout, stderr to files), once rank 0 has printed
    its first step: the launcher and every process under it (ranks, helpers). Whatever a failed
    assertion leaves of it is killed after the test."""
    out, err = open(tmp_path / "stdout", "w"), open(tmp_path / "stderr", "w")
    proc = subprocess.Popen([sys.executable, "-m", "pipert.cli", "train", "--stages", str(stages), "--steps", "100000",
                             "--json", "--timeout", str(TIMEOUT)], stdout=out, stderr=err, env=_env(tmp_path),
                            start_new_session=True, cwd=tmp_path)
    try:
        end = time.monotonic() + 240
        while not (tmp_path / "stdout").read_text().startswith("{"):
            assert proc.poll() is None, (tmp_path / "stderr").read_text()[-3000:]
            assert time.monotonic() < end, "no step within 240 s"
            time.sleep(0.2)
        procs = _descendants(proc.pid)
        assert sorted(c for c in map(_comm, procs) if c.startswith("pipert-rank")) == \
            [f"pipert-rank{r}" for r in range(stages)]
        assert [f for f in os.listdir(tmp_path / "tmp") if f.startswith("pipert-")], "the job folder exists"
        yield proc, procs
    finally:
        for p in [*_descendants(proc.pid), proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        proc.wait()


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rpartition(")")[2].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d.name))
    return kids


def _descendants(pid: int) -> list[int]:
    kids, out, todo = _children(), [], [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    except OSError:
        return ""


def _assert_nothing_left(proc: subprocess.Popen, procs: list[int], tmp_path: Path, deadline: float) -> None:
    """By ``deadline`` (time.monotonic()): the launcher has exited, none of its processes runs and
    the job's temporary directory is empty."""
    proc.wait(max(deadline - time.monotonic(), 0.1))
    while True:
        running = [p for p in procs if _running(p)]
        files = os.listdir(tmp_path / "tmp")
        if not running and not files:
            return
        assert time.monotonic() < deadline, ([(p, _comm(p), _cmdline(p)) for p in running], files,
                                             (tmp_path / "stderr").read_text()[-3000:])
        time.sleep(0.1)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_stopping_the_launcher_ends_every_rank_and_removes_its_folders(tmp_path, sig):
    """SIGKILL runs no handler in the launcher: its ranks notice it is gone and clean up."""
    with _training(tmp_path, 2) as (proc, procs):
        os.kill(proc.pid, sig)
        _assert_nothing_left(proc, procs, tmp_path, time.monotonic() + 10)
        if sig == signal.SIGTERM:
            assert proc.returncode == 128 + sig
            assert (tmp_path / "stderr").read_text().strip().splitlines()[-1] == "pipert train: stopped by SIGTERM"


def test_a_stopped_rank_ends_the_job_naming_it(tmp_path):
    with _training(tmp_path, 2) as (proc, procs):
        [rank1] = [p for p in procs if _comm(p) == "pipert-rank1"]
        os.kill(rank1, signal.SIGSTOP)
        t0 = time.monotonic()
        _assert_nothing_left(proc, procs, tmp_path, t0 + TIMEOUT + 10)
        print(f"job ended {time.monotonic() - t0:.1f} s after SIGSTOP (--timeout {TIMEOUT})")
        err = (tmp_path / "stderr").read_text()
        assert proc.returncode == 1, err[-3000:]
        summary = err[err.index("pipeline ranks failed, root cause first:"):].splitlines()
        assert summary[1].startswith("  rank 1: stopped by the launcher") and "suspended" in summary[1], summary
        # rank 0 waited for rank 1 in a pipeline action (its error names rank 1) or in the step's loss
        # all-reduce (gloo's timeout, no peer named)
        assert re.match(r"  rank 0: (PipelineTimeout: rank 0 stalled at action \d+ .* from rank 1, which did not "
                        r"respond|RuntimeError: Timed out waiting \d+ms for recv operation to complete)( \(at \S+:\d+ in \S+\))?$",
                        summary[2]), summary
        assert len(summary) == 4 and "gloo" not in err[err.index("root cause first"):], summary
        log = summary[3].removeprefix("full errors of every rank: ")
        assert "--- rank 0 ---\nTraceback" in open(log).read()  # the full errors are in the log file
        assert "Traceback" not in err  # and not on the terminal


def test_ctrl_c_ends_cleanly(tmp_path):
    with _training(tmp_path, 2) as (proc, procs):
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal sends to its foreground process group
        _assert_nothing_left(proc, procs, tmp_path, time.monotonic() + 10)
        err = (tmp_path / "stderr").read_text()
        assert proc.returncode == 130, err[-3000:]
        assert err.strip() == "pipert train: stopped by SIGINT", err[-3000:]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("backend", ["gloo", "nccl-sim"])
def test_two_torchrun_nodes_train_exactly(tmp_path, backend):
    """Two torchrun agents on this machine as two nodes of 2 processes each (c10d rendezvous,
    gloo, and gloo with NCCL's rules): `pipert train` runs as the rank torchrun gives each
    process, rank 0 prints."""
    port = _free_port()
    env = _env(tmp_path)
    nodes = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2", "--node-rank",
         str(n), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "-m", "pipert.cli", "train",
         "--stages", "4", "--steps", "2", "--check", "--json", "--dtype", "float64", "--backend", backend],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for n in range(2)]
    outs = [p.communicate(timeout=300) for p in nodes]
    for p, (_, err) in zip(nodes, outs):
        assert p.returncode == 0, err[-3000:]
    steps = [json.loads(line) for out, _ in outs for line in out.splitlines() if line.startswith("{")]
    assert [s["step"] for s in steps] == [0, 1], outs
    assert steps[0]["rank_param_bytes"] and len(steps[0]["rank_param_bytes"]) == 4
    for s in steps:
        assert s["max_grad_rel_err"] <= 1e-10 and s["max_param_rel_err"] <= 1e-10, s
        assert abs(s["loss"] - s["ref_loss"]) <= 1e-12 * abs(s["ref_loss"]), s


def _report_start(rank: int, world: int, out: str) -> None:
    """What a rank started with: environment variables, its rank and its parent; and a line on
    its stdout."""
    Path(out, f"{rank}.json").write_text(json.dumps({
        "x": os.environ.get("PIPERT_TEST_LAUNCH_X"), "test": os.environ.get("PYTEST_CURRENT_TEST"),
        "ppid": os.getppid(), "rank": os.environ["RANK"]}))
    os.write(1, f"rank {rank} of {out}\n".encode())


def _launch_reporting(out: Path) -> list[dict]:
    from pipert.launch import launch
    out.mkdir()
    launch(_report_start, 2, args=(str(out),), timeout=60.0)
    got = [json.loads((out / f"{r}.json").read_text()) for r in range(2)]
    assert [g["rank"] for g in got] == ["0", "1"]
    assert all(g["ppid"] != os.getpid() for g in got), got
    return got


def test_ranks_fork_from_a_server_and_see_each_launchs_environment(tmp_path, monkeypatch):
    """Ranks are forks of a server that imported torch (pipert.launch.starter), not children of
    this process; a variable changed between two launches reaches the second launch's ranks
    (through a new server: torch may read it at import)."""
    servers = []
    for value in ("one", "two"):
        monkeypatch.setenv("PIPERT_TEST_LAUNCH_X", value)
        got = _launch_reporting(tmp_path / value)
        assert [g["x"] for g in got] == [value, value], got
        servers.append({g["ppid"] for g in got})
    assert len(servers[0]) == 1 and servers[0] != servers[1], servers


def test_ranks_write_to_each_launchs_stdout_from_one_server(tmp_path, monkeypatch):
    """Between two launches this process's stdout moves to another file and pytest's per-test
    variable changes: each launch's ranks write to the stdout of their launch and see its
    variable, and both launches fork from the same server (no second torch import)."""
    saved = os.dup(1)
    servers = []
    try:
        for name in ("first", "second"):
            monkeypatch.setenv("PYTEST_CURRENT_TEST", f"launch {name}")
            with open(tmp_path / f"{name}.out", "wb") as f:
                os.dup2(f.fileno(), 1)
            got = _launch_reporting(tmp_path / name)
            os.dup2(saved, 1)
            assert [g["test"] for g in got] == [f"launch {name}"] * 2, got
            servers.append({g["ppid"] for g in got})
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    for name in ("first", "second"):
        lines = sorted((tmp_path / f"{name}.out").read_text().splitlines())
        assert lines == [f"rank {r} of {tmp_path / name}" for r in range(2)], (name, lines)
    assert len(servers[0]) == 1 and servers[0] == servers[1], servers

"""A failed job's summary: root cause first (following the peer each error names), one line per
rank without the C++ libraries' own text; the full errors kept."""
from pipert.launch.failures import LaunchError, RankEnd, headline, root_cause_order

GLOO = ("([/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
        "[127.0.0.1]:1461. This is typically caused by a remote worker crashing. GLHF! 🏖️)")


def _failed(rank: int, seen: float | None, message: str) -> RankEnd:
    return RankEnd(rank, f"Traceback (most recent call last):\n  ...\n{message}", message, seen)


def test_headline_drops_the_library_text():
    msg = f"PipelineError: rank 1 failed at action 9 (SEND act u1 m2 ->2): peer rank 2 went away {GLOO}"
    assert headline(msg) == "PipelineError: rank 1 failed at action 9 (SEND act u1 m2 ->2): peer rank 2 went away"
    assert headline("ValueError: first line\nsecond line") == "ValueError: first line"


def test_a_rank_that_died_is_the_root_cause_even_when_a_neighbour_was_seen_first():
    ends = {
        1: _failed(1, 1.00, f"PipelineError: rank 1 failed at action 9 (SEND act u1 m2 ->2): peer rank 2 went away {GLOO}"),
        2: RankEnd(2, "exited with code 3", "exited with code 3", 1.05),
        3: _failed(3, 1.06, "PipelineError: rank 3 failed at action 0 (RECV act u2 m0 <-2): peer rank 2 went away"),
        0: _failed(0, 1.20, "PipelineError: rank 0 failed at action 6 (RECV grad u0 m0 <-1): peer rank 1 went away"),
    }
    assert root_cause_order(ends) == [2, 1, 3, 0]


def test_a_chain_of_stalls_leads_to_the_rank_that_was_stopped():
    """Rank 0 timed out first waiting for rank 1, which waited for rank 2: rank 2, killed by the
    launcher, is the root cause."""
    ends = {
        0: _failed(0, 3.0, "PipelineTimeout: rank 0 stalled at action 6 (RECV grad u0 m0 <-1): waited 3 s for grad "
                           "from rank 1, which did not respond"),
        1: _failed(1, 3.1, "PipelineTimeout: rank 1 stalled at action 7 (RECV grad u1 m0 <-2): waited 3 s for grad "
                           "from rank 2, which did not respond"),
        2: RankEnd(2, "stopped by the launcher", "stopped by the launcher: still running 3 s after rank 0 failed", None),
    }
    assert root_cause_order(ends) == [2, 1, 0]


def test_the_first_failure_is_the_root_cause_when_its_peer_did_not_fail():
    ends = {3: _failed(3, 2.0, "PipelineTimeout: rank 3 stalled ... for act from rank 2, which did not respond"),
            1: _failed(1, 1.0, "RuntimeError: out of memory")}
    assert root_cause_order(ends) == [1, 3]
    cycle = {0: _failed(0, 1.0, "x: peer rank 1 went away"), 1: _failed(1, 1.0, "x: peer rank 0 went away")}
    assert root_cause_order(cycle) == [1, 0]


def test_launch_error_summary_and_report(tmp_path):
    ends = {2: RankEnd(2, "exited with code 3", "exited with code 3", 1.0),
            1: _failed(1, 1.1, f"PipelineError: rank 1 failed at action 9 (SEND act u1 m2 ->2): peer rank 2 went away "
                               f"{GLOO}")}
    order = root_cause_order(ends)
    err = LaunchError({r: ends[r].text for r in order}, order, {r: ends[r].message for r in order})
    assert str(err).splitlines() == ["pipeline ranks failed, root cause first:", "  rank 2: exited with code 3",
                                     "  rank 1: PipelineError: rank 1 failed at action 9 (SEND act u1 m2 ->2): peer "
                                     "rank 2 went away"]
    report = err.report(str(tmp_path))
    summary, _, path = report.rpartition("\nfull errors of every rank: ")
    assert summary == str(err) and "pair.cc" not in summary  # a few lines, root cause first, no gloo text
    log = open(path).read()
    assert log.startswith(str(err)) and "--- rank 1 ---\nTraceback" in log and "pair.cc:553" in log  # all of it
    assert log.index("--- rank 2 ---") < log.index("--- rank 1 ---")
    assert LaunchError({0: "Traceback ...\nValueError: bad"}).errors == {0: "Traceback ...\nValueError: bad"}
    assert str(LaunchError({0: "Traceback ...\nValueError: bad"})).endswith("rank 0: ValueError: bad")


def test_a_collective_timeout_leads_to_the_rank_still_running():
    """gloo's own timeout names no peer: the rank the launcher found still running (suspended
    first) did not answer."""
    timeout = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] "
               "Timed out waiting 4000ms for recv operation to complete")
    assert headline(timeout) == "RuntimeError: Timed out waiting 4000ms for recv operation to complete"
    ends = {0: _failed(0, 4.0, timeout),
            1: RankEnd(1, "stopped by the launcher: still running", "stopped by the launcher: still running", None),
            2: RankEnd(2, "stopped by the launcher: still running (it was suspended: process state T)",
                       "stopped by the launcher: still running (it was suspended: process state T)", None)}
    assert root_cause_order(ends) == [2, 0, 1]
    crashed = {0: _failed(0, 4.0, "RuntimeError: out of memory"), 1: ends[1]}
    assert root_cause_order(crashed) == [0, 1]


def test_the_summary_names_where_each_rank_raised():
    trace = ('Traceback (most recent call last):\n  File "/x/train.py", line 10, in main\n    step()\n'
             '  File "/x/ckpt.py", line 42, in read_shard\n    raise EOFError("short read")\nEOFError: short read')
    err = LaunchError({0: trace, 1: "killed by signal SIGKILL"}, [0, 1])
    assert str(err).splitlines()[1:] == ["  rank 0: EOFError: short read (at /x/ckpt.py:42 in read_shard)",
                                         "  rank 1: killed by signal SIGKILL"]


def test_the_summary_and_a_stop_start_below_the_progress_bar(monkeypatch, capsys, tmp_path):
    """Without --json rank 0's progress bar ends without a newline when the job fails or is
    stopped: the summary (and the CLI's "stopped by") start on their own line; with --json, where
    no bar is drawn, nothing is added."""
    import pipert.train
    from pipert.cli import main
    monkeypatch.chdir(tmp_path)
    end = RankEnd(1, "exited with code 3", "exited with code 3", 1.0)
    failures: list[BaseException] = []

    def fail(cfg):
        raise failures.pop(0)
    monkeypatch.setattr(pipert.train, "run_train", fail)
    for json_flag, bar_line in (([], "\n"), (["--json"], "")):
        failures[:] = [LaunchError({1: end.text}, [1], {1: end.message}), KeyboardInterrupt()]
        assert main(["train", "--stages", "2", *json_flag]) == 1
        assert capsys.readouterr().err.startswith(bar_line + "pipeline ranks failed, root cause first:")
        assert main(["train", "--stages", "2", *json_flag]) == 130
        assert capsys.readouterr().err == bar_line + "pipert train: stopped by SIGINT\n"


def test_rank_zeros_progress_bar_leaves_no_semaphore_when_the_rank_exits_at_once():
    """A rank (a fork-server child) that draws the bar and leaves by os._exit, as a failed rank
    does, leaves no semaphore for the resource tracker to warn about below the summary."""
    import subprocess
    import sys
    code = ("import multiprocessing, os, sys; multiprocessing.set_start_method('forkserver'); "
            "from pipert.train import progress_bar; progress_bar(3, 'x').update(1); sys.stderr.flush(); os._exit(0)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "1/3" in run.stderr, run.stderr
    assert "leaked semaphore" not in run.stderr, run.stderr

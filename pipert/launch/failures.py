"""What the ranks of a failed job said, root cause first (no torch import: the CLI reads these)."""
from __future__ import annotations

import os
import re
import signal
import tempfile
from dataclasses import dataclass

__all__ = ["RankEnd", "LaunchError", "LaunchInterrupted", "root_cause_order", "headline", "raised_at"]

_BLAMED = re.compile(r"\b(?:from|to|peer) rank (\d+)\b")
"""The peer a runtime error names as the one it waited for or lost (pipert.exec.executor's wording)."""
_LIBRARY_TEXT = re.compile(r"\s*\(\[[^\]\n]*\.(?:c|cc|cpp|cu|h|hpp):\d+\][^\n]*")
"""A C++ library's own message in parentheses, e.g. gloo's "([.../pair.cc:553] Connection closed by peer ...)"."""
_SOURCE_PLACE = re.compile(r"\[[^\]\s]*\.(?:c|cc|cpp|cu|h|hpp):\d+\]\s*")
"""A C++ library's source location, e.g. "[/__w/pytorch/.../unbound_buffer.cc:78] "."""
_TIMED_OUT = re.compile(r"\btimed out\b", re.IGNORECASE)
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)', re.MULTILINE)
"""A frame of a Python traceback."""


@dataclass
class RankEnd:
    """How one rank of a job ended."""

    rank: int
    text: str
    """Its full error: the traceback its error file holds, or how it ended."""
    message: str
    """The error in one line (with the library noise that ``headline`` strips)."""
    seen: float | None = None
    """When the launcher saw it end (time.monotonic()); None: it was still running and was stopped."""


def headline(message: str) -> str:
    """The first line of ``message`` without the C++ libraries' own text."""
    lines = message.strip().splitlines() or ["failed"]
    return _SOURCE_PLACE.sub("", _LIBRARY_TEXT.sub("", lines[0])).strip()


def raised_at(text: str) -> str | None:
    """Where the last exception of a Python traceback was raised, as ``file:line in function``
    (the file relative to the folder that holds the pipert package when it is inside it); None
    when ``text`` holds no traceback."""
    frames = _FRAME.findall(text)
    if not frames:
        return None
    path, line, fn = frames[-1]
    base = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if path.startswith(base + os.sep):
        path = os.path.relpath(path, base)
    return f"{path}:{line} in {fn}"


def root_cause_order(ends: dict[int, RankEnd]) -> list[int]:
    """Ranks root cause first: from the first rank seen failing, follow the peer each error names
    (the rank it waited for or lost) while that peer also failed or was stopped; a timeout that
    names no peer (a collective) leads to a rank the launcher found still running (a suspended one
    first). The last rank of that chain is the root cause, then the chain back to the first
    failure, then the others in the order they ended (the ones stopped by the launcher last)."""
    if not ends:
        return []
    by_time = sorted(ends, key=lambda r: (ends[r].seen is None, ends[r].seen or 0.0, r))
    still_running = sorted((r for r in ends if ends[r].seen is None), key=lambda r: ("suspended" not in ends[r].text, r))
    chain = [by_time[0]]
    while True:
        line = headline(ends[chain[-1]].message)
        named = _BLAMED.search(line)
        if named:
            peers = [int(named.group(1))]
        else:
            peers = still_running if _TIMED_OUT.search(line) else []
        peer = next((p for p in peers if p not in chain), None)
        if peer is None or peer not in ends:
            break
        chain.append(peer)
    return chain[::-1] + [r for r in by_time if r not in chain]


class LaunchError(RuntimeError):
    """One or more ranks failed; ``errors`` maps rank -> that rank's full error text, ``order``
    lists them root cause first; the message is one line per rank in that order: its error's
    first line without the libraries' own text, and where it was raised."""

    def __init__(self, errors: dict[int, str], order: list[int] | None = None,
                 messages: dict[int, str] | None = None) -> None:
        self.errors = errors
        self.order = order if order is not None else sorted(errors)
        self.messages = messages if messages is not None else {
            r: (t.strip().splitlines() or ["failed"])[-1] for r, t in errors.items()}
        lines = []
        for r in self.order:
            where = raised_at(self.errors.get(r, ""))
            lines.append(f"rank {r}: {headline(self.messages[r])}" + (f" (at {where})" if where else ""))
        super().__init__("pipeline ranks failed, root cause first:\n  " + "\n  ".join(lines))

    def log(self) -> str:
        """The summary, then every failed rank's full error, root cause first."""
        parts = [f"--- rank {r} ---\n{self.errors[r].rstrip()}" for r in self.order]
        return "\n".join([str(self), *parts]) + "\n"

    def report(self, log_dir: str | None = None) -> str:
        """The summary and the file that now holds :meth:`log`: the few lines a terminal shows
        after a failed run. The file goes to ``log_dir`` (default: the current folder, else the
        temporary folder when the current one is not writable)."""
        for folder in ([log_dir] if log_dir is not None else [os.getcwd(), tempfile.gettempdir()]):
            try:
                fd, path = tempfile.mkstemp(prefix="pipert-failed-", suffix=".log", dir=folder)
            except OSError:
                continue
            with os.fdopen(fd, "w") as f:
                f.write(self.log())
            return f"{self}\nfull errors of every rank: {path}"
        return self.log()


class LaunchInterrupted(KeyboardInterrupt):
    """The launcher got a stop signal (Ctrl-C, SIGTERM, ...) and ended every rank first."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

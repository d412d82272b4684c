"""What the ranks of a failed job said, root cause first (no torch import: the CLI reads these)."""
from __future__ import annotations

import re
import signal
from dataclasses import dataclass

__all__ = ["RankEnd", "LaunchError", "LaunchInterrupted", "root_cause_order", "headline"]

_BLAMED = re.compile(r"\b(?:from|to|peer) rank (\d+)\b")
"""The peer a runtime error names as the one it waited for or lost (pipert.exec.executor's wording)."""
_LIBRARY_TEXT = re.compile(r"\s*\(\[[^\]\n]*\.(?:c|cc|cpp|cu|h|hpp):\d+\][^\n]*")
"""A C++ library's own message in parentheses, e.g. gloo's "([.../pair.cc:553] Connection closed by peer ...)"."""
_SOURCE_PLACE = re.compile(r"\[[^\]\s]*\.(?:c|cc|cpp|cu|h|hpp):\d+\]\s*")
"""A C++ library's source location, e.g. "[/__w/pytorch/.../unbound_buffer.cc:78] "."""
_TIMED_OUT = re.compile(r"\btimed out\b", re.IGNORECASE)


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
    lists them root cause first; the message is one line per rank in that order."""

    def __init__(self, errors: dict[int, str], order: list[int] | None = None,
                 messages: dict[int, str] | None = None) -> None:
        self.errors = errors
        self.order = order if order is not None else sorted(errors)
        self.messages = messages if messages is not None else {
            r: (t.strip().splitlines() or ["failed"])[-1] for r, t in errors.items()}
        lines = [f"rank {r}: {headline(self.messages[r])}" for r in self.order]
        super().__init__("pipeline ranks failed, root cause first:\n  " + "\n  ".join(lines))

    def report(self) -> str:
        """Every failed rank's full error, then the summary (the part a terminal keeps in view)."""
        parts = [f"--- rank {r} ---\n{self.errors[r].rstrip()}" for r in sorted(self.errors)]
        return "\n".join(parts + [str(self)])


class LaunchInterrupted(KeyboardInterrupt):
    """The launcher got a stop signal (Ctrl-C, SIGTERM, ...) and ended every rank first."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

"""The host side of the CUDA streams' chains of timed kernels (pipert.device.streams.Chain):
a timed kernel starts from the previous one's ideal end only when nothing else was enqueued
on its stream in between (the CPU stream workers' ideal clock, csrc/core/stream.h)."""
import torch

from pipert.device.streams import Chain


def _chain():
    made = []

    def alloc():
        made.append(torch.zeros(1, dtype=torch.int64))
        return made[-1]
    return Chain(alloc), made


def test_a_timed_kernel_after_a_timed_kernel_continues_the_chain():
    chain, made = _chain()
    word, first = chain.timed(100)
    assert first == -1  # nothing before it on the stream: starts at the device's now
    assert chain.timed(200) == (word, 200) and chain.timed(300) == (word, 300)  # back to back: chained
    assert len(made) == 1 and word == made[0].data_ptr()  # one word per stream, made at first use


def test_anything_else_on_the_stream_breaks_the_chain():
    chain, _ = _chain()
    chain.timed(100)
    chain.untimed()  # a copy, a wait for an event, a callable's kernels
    assert chain.timed(200)[1] == -1
    assert chain.timed(300)[1] == 300


def test_without_a_device_clock_or_disabled_nothing_chains(monkeypatch):
    chain, _ = _chain()
    chain.timed(-1)
    assert chain.timed(-1)[1] == -1  # no enqueue time in the device's clock: no chain
    monkeypatch.setattr(Chain, "enabled", False)
    chain.timed(100)
    assert chain.timed(200)[1] == -1

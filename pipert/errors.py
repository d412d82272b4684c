"""The errors a running pipeline raises; every layer (exec, comm, launch, pipeline) names its
failures with these, so none has to import another to catch them."""
from __future__ import annotations

__all__ = ["PipelineError", "PipelineTimeout", "CommTimeout", "PeerFailure"]


class PipelineError(RuntimeError):
    """A pipeline step failed on some rank; the message names rank, action and peer."""

    def __init__(self, message: str, rank: int | None = None, peer: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.peer = peer


class PipelineTimeout(PipelineError):
    """A communication wait exceeded the pipeline's timeout."""


class CommTimeout(RuntimeError):
    """A communication wait did not complete in time."""


class PeerFailure(RuntimeError):
    """A communication failed because a peer went away."""

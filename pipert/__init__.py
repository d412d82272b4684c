"""pipert: a pipeline-parallel training runtime for PyTorch."""
__version__ = "0.1.0"

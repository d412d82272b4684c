"""The analytic cost model's recompute modes (pipert.cost.transformer), in a module of their own:
the command line's parser lists them without importing the model."""

RECOMPUTE_MODES = ("none", "no_attention")
"""Recomputation inside every unit the model prices: none, or HelixPipe's without attention."""

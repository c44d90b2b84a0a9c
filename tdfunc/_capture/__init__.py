"""Captured training steps: recorded once as a CUDA graph, replayed per call."""

from .step import CapturedStep as CapturedStep
from .step import capture_step as capture_step

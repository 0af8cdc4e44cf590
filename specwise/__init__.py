"""specwise: exact speculative decoding for causal language models."""

from specwise.engine import Engine, GenerationEvent, GenerationResult
from specwise.metrics import SpecStats
from specwise.sampling import SamplingParams

__version__ = "0.1.0"

__all__ = ["Engine", "GenerationEvent", "GenerationResult", "SamplingParams", "SpecStats", "__version__"]

"""Speculative decoding that never changes the text: drafters, token trees, the round loop, sampling.

See README.md in this directory for why the scheme is lossless.
"""

from elpis.spec.generate import SpeculativeGenerator
from elpis.spec.integrity import RoundFault
from elpis.spec.request import GenerationRequest, GenerationStats, Step
from elpis.spec.sampling import SamplingParams

__all__ = [
    "GenerationRequest",
    "GenerationStats",
    "RoundFault",
    "SamplingParams",
    "SpeculativeGenerator",
    "Step",
]

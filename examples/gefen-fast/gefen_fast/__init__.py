"""gefen-fast: the Gefen optimizer with fused CPU kernels, certified by ``pytest --impl=fast``.

``gefen_fast.Gefen`` takes ``gefen_reference.Gefen``'s constructor and writes its native state
format; ``gefen_fast.conformance.IMPLEMENTATION`` is what the conformance suite runs.
"""

from .optimizer import Gefen

__version__ = "0.1.0"

__all__ = ["Gefen", "__version__"]

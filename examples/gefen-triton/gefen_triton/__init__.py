"""gefen-triton: the Gefen optimizer with Triton kernels, certified by ``pytest --impl=triton``.

``gefen_triton.Gefen`` takes ``gefen_reference.Gefen``'s constructor and writes its native state
format; ``gefen_triton.conformance.IMPLEMENTATION`` is what the conformance suite runs. The
kernels are compiled for GPU tensors, or run on CPU tensors by Triton's interpreter
(``TRITON_INTERPRET=1``).
"""

from .optimizer import Gefen

__version__ = "0.1.0"

__all__ = ["Gefen", "__version__"]

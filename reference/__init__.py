"""Reference implementation of the Gefen optimizer and its DCP adapter (the conformance oracle).

Readable and strict rather than fast. Imports neither ``conformance`` nor ``oracles``
and never imports the published ``gefen`` package.
"""

from .optimizer import Gefen

__all__ = ["Gefen"]

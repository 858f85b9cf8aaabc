"""Independent checkers: what the suite judges an implementation by (SPEC Part 5).

Each module reads files or tensors and returns findings, never importing an implementation (the
reference included) nor recording anything itself: ``checkpoint_reader`` reads a DCP directory,
``gefen_schema`` validates its content, ``digests`` identify it, ``checkpoint_compare`` and
``native_compare`` compare two states, ``numeric`` holds the comparison primitives and the two
numeric profiles, ``kernel_bounds`` what correct rounding may change, ``pinned_step``,
``free_running`` and ``shadowing`` judge optimizer steps, ``codebook_quality`` a learned codebook,
``memory`` a save's memory, ``golden_manifest`` the committed goldens, and ``safetensors_io``
with ``vector_check`` the exported test vectors and a kernel's results against them (without torch).
"""

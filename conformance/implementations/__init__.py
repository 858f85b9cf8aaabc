"""Adapters that register implementations with the suite (the reference and gefen-x)."""

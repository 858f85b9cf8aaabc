"""Which numeric profile judges a run: bitwise (``torch-exact``) or ``tolerance`` (SPEC 0.4.3, 4.6.4).

Bitwise equality with the reference is a claim about CPU arithmetic only: an implementation is
judged bitwise when it declares ``cpu-bit-exact`` *and* its tensors live on the CPU. On any other
device (``--gefen-device cuda``, ...) the tolerance profile applies whatever the implementation
declares, and the certificate's ``profile.reason`` says so. Every place of the suite that chooses
between the two asks :func:`bitwise`; the certificate asks :func:`choose`.
"""

from __future__ import annotations

import torch

from gefen_conformance.harness import devices
from gefen_conformance.implementations.contract import CPU_BIT_EXACT

__all__ = ["bitwise", "choose"]


def choose(capabilities, device: torch.device) -> tuple[str, str]:
    """``(profile name, reason)`` for an implementation declaring ``capabilities`` whose tensors
    live on ``device``."""
    device = torch.device(device)
    declared = CPU_BIT_EXACT in capabilities
    if device.type != "cpu":
        claim = "declared, but it covers CPU arithmetic only" if declared else "not declared"
        return "tolerance", f"device {device}: a non-CPU device is always judged by tolerance ({CPU_BIT_EXACT} {claim})"
    if declared:
        return "torch-exact", f"{CPU_BIT_EXACT} declared"
    return "tolerance", f"{CPU_BIT_EXACT} not declared"


def bitwise(impl, device: torch.device | None = None) -> bool:
    """Whether ``impl`` is judged bitwise against the reference on ``device`` (default: the run's
    device, :func:`conformance.devices.selected`)."""
    device = devices.selected() if device is None else device
    return choose(impl.capabilities, device)[0] == "torch-exact"

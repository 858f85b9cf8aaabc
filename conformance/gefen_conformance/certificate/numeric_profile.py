"""Which numeric profile judges a run: bitwise (``torch-exact``) or ``tolerance`` (SPEC 0.4.3, 4.6.4).

Bitwise equality with the reference is a claim about CPU arithmetic only: an implementation is
judged bitwise when it declares ``cpu-bit-exact`` *and* its tensors live on the CPU. On any other
device (``--gefen-device cuda``, ...) the tolerance profile applies whatever the implementation
declares, and the certificate's ``profile.reason`` says so. :func:`choose` returns the decision as
one :class:`NumericProfile`; every place of the suite that chooses between the two asks
:func:`bitwise`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gefen_conformance.harness import devices
from gefen_conformance.implementations.contract import CPU_BIT_EXACT
from gefen_oracles.numeric import Profile, profile_description

__all__ = ["NumericProfile", "Profile", "bitwise", "choose"]


@dataclass(frozen=True)
class NumericProfile:
    """The profile a run is judged by and why (the certificate's ``profile.name`` and ``profile.reason``)."""

    profile: Profile
    reason: str

    @property
    def name(self) -> str:
        return self.profile.value

    @property
    def bitwise(self) -> bool:
        """True for ``torch-exact``: every compared element bitwise equal to the reference's."""
        return self.profile is Profile.TORCH_EXACT

    def described(self) -> dict:
        """The certificate's ``profile``: name, reason, then every rule and bound it applies (SPEC 5.3)."""
        described = dict(profile_description(self.profile))
        described.pop("name", None)
        return {"name": self.name, "reason": self.reason, **described}


def choose(capabilities, device: torch.device) -> NumericProfile:
    """The profile of an implementation declaring ``capabilities`` whose tensors live on ``device``."""
    device = torch.device(device)
    declared = CPU_BIT_EXACT in capabilities
    if device.type != "cpu":
        claim = "declared, but it covers CPU arithmetic only" if declared else "not declared"
        return NumericProfile(
            Profile.TOLERANCE,
            f"device {device}: a non-CPU device is always judged by tolerance ({CPU_BIT_EXACT} {claim})",
        )
    if declared:
        return NumericProfile(Profile.TORCH_EXACT, f"{CPU_BIT_EXACT} declared")
    return NumericProfile(Profile.TOLERANCE, f"{CPU_BIT_EXACT} not declared")


def bitwise(impl, device: torch.device | None = None) -> bool:
    """Whether ``impl`` is judged bitwise against the reference on ``device`` (default: the run's
    device, :func:`gefen_conformance.harness.devices.selected`)."""
    return choose(impl.capabilities, devices.selected() if device is None else device).bitwise

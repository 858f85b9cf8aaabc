"""The plugin contract: what an implementation hands the suite (SPEC 4.1).

An implementation is one :class:`Implementation` instance, registered under the entry-point
group ``gefen_conformance.implementations`` or named on the command line as
``package.module:attribute``. The suite only ever talks to an implementation through these
fields and the public APIs they return (``torch.optim.Optimizer`` methods, DCP ``Stateful``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

# Capability tags. A test that needs a capability the implementation lacks is skipped with
# the reason; a missing capability is not a failure (SPEC 4.1.3).
NATIVE_STATE_DICT = "native-state-dict"  # state_dict()/load_state_dict() in the published format
CPU_BIT_EXACT = "cpu-bit-exact"          # bitwise equal to the reference on CPU (torch-exact profile)
FACTORED_SECOND_MOMENT = "factored-v"    # supports factored_v_2d=True
DCP_RESHARD = "dcp-reshard"              # dcp_state() saves and restores across world sizes
DCP_SAVE_PLANNER = "dcp-save-planner"    # save_planner() returns a memory-bounded planner
DCP_ASYNC_SAVE = "dcp-async-save"        # async_writer() supports dcp.async_save

KNOWN_CAPABILITIES = frozenset(
    {NATIVE_STATE_DICT, CPU_BIT_EXACT, FACTORED_SECOND_MOMENT, DCP_RESHARD, DCP_SAVE_PLANNER, DCP_ASYNC_SAVE}
)


@dataclass(frozen=True)
class Implementation:
    """An implementation under test.

    ``make_optimizer(params, **hyperparameters)`` builds the optimizer with the reference's
    constructor keywords. ``dcp_state(optimizer)`` returns the DCP ``Stateful`` adapter;
    ``save_planner()`` a save planner (or None for DCP's default); ``async_writer(path)`` a
    storage writer usable with ``dcp.async_save`` (None when unsupported).
    ``expected_failures`` maps suite test ids (``test_module.py::test_name[params]``) to the
    reason each is a known failure; every entry needs a non-empty reason, and entries that
    match no collected test are reported as stale.

    ``prepare(device)`` (optional) pays the implementation's one-time costs: a C build or load,
    a Triton or inductor compile, an autotune. The suite calls it once in every process that runs
    the implementation, before any scenario and outside every deadline (SPEC 4.2.11): in the test
    process (each xdist worker) at the warm-up, with the run's device, and in each rank process
    before its first call on a device, with that rank's device. It must be idempotent and safe
    when several processes run it at once (a build into a shared cache must be atomic). Its time
    is part of the certificate's ``execution.warm_up_s``; what it raises is a note of the
    certificate, and a rank's is that rank's failure.
    """

    name: str
    version: str
    make_optimizer: Callable[..., Any]
    dcp_state: Optional[Callable[[Any], Any]] = None
    save_planner: Optional[Callable[[], Any]] = None
    async_writer: Optional[Callable[[str], Any]] = None
    capabilities: frozenset = frozenset()
    expected_failures: Mapping[str, str] = field(default_factory=dict)
    prepare: Optional[Callable[[Any], None]] = None

    def __post_init__(self):
        if not self.name or not isinstance(self.name, str):
            raise ValueError("an implementation needs a non-empty name")
        if not callable(self.make_optimizer):
            raise TypeError(f"implementation {self.name!r}: make_optimizer must be callable")
        if self.prepare is not None and not callable(self.prepare):
            raise TypeError(f"implementation {self.name!r}: prepare must be callable (or None)")
        unknown = set(self.capabilities) - KNOWN_CAPABILITIES
        if unknown:
            raise ValueError(f"implementation {self.name!r} declares unknown capabilities {sorted(unknown)} "
                             f"(known: {', '.join(sorted(KNOWN_CAPABILITIES))})")
        missing = [k for k, why in self.expected_failures.items() if not str(why).strip()]
        if missing:
            raise ValueError(f"implementation {self.name!r}: expected failures without a reason: {missing}")
        object.__setattr__(self, "capabilities", frozenset(self.capabilities))

    def has(self, capability: str) -> bool:
        return capability in self.capabilities

    def resolved_as(self, spec: str) -> None:
        """Remember the spec ``registry.resolve`` found this implementation under: it then pickles
        as that spec, and unpickles as the receiving process's own resolution of it."""
        object.__setattr__(self, "_spec", spec)

    def __reduce_ex__(self, protocol):
        spec = self.__dict__.get("_spec")
        if spec is None:
            return super().__reduce_ex__(protocol)
        from gefen_conformance.implementations.registry import resolve

        return (resolve, (spec,))

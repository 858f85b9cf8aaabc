"""The plugin contract: what an implementation hands the suite (SPEC 4.1).

An implementation is one :class:`Implementation` instance, registered under the entry-point
group ``gefen_conformance.implementations`` or named on the command line as
``package.module:attribute``. The suite only ever talks to an implementation through these
fields and the public APIs they return (``torch.optim.Optimizer`` methods, DCP ``Stateful``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


class Capability(str, enum.Enum):
    """What an implementation claims (SPEC 4.1.3). A test that needs a capability the
    implementation lacks is skipped, and the skip carries the capability; a missing capability is
    never a failure. The values are the tags certificates record."""

    NATIVE_STATE_DICT = (
        "native-state-dict"  # state_dict()/load_state_dict() in the published format (SPEC 1.11-1.12)
    )
    CPU_BIT_EXACT = (
        "cpu-bit-exact"  # bitwise equal to the reference on CPU: the torch-exact profile (SPEC 0.4.1)
    )
    FACTORED_V = "factored-v"  # the factored second moment, factored_v_2d=True (SPEC 1.9)
    DCP_RESHARD = (
        "dcp-reshard"  # the DCP adapter: dcp_state() saves and restores across world sizes (Parts 2-3)
    )
    DCP_SAVE_PLANNER = "dcp-save-planner"  # save_planner() returns a memory-bounded planner (SPEC 2.5)
    DCP_ASYNC_SAVE = "dcp-async-save"  # async_writer() supports dcp.async_save (SPEC 2.6)

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, value: Capability | str) -> Capability:
        """``value`` (a member or its tag) as a member; ValueError naming the known tags otherwise."""
        try:
            return cls(value)
        except ValueError:
            raise ValueError(
                f"unknown capability {value!r} (known: {', '.join(sorted(c.value for c in cls))})"
            ) from None


# The members under their own names, as implementations import them (``from gefen_conformance import
# DCP_RESHARD``).
NATIVE_STATE_DICT = Capability.NATIVE_STATE_DICT
CPU_BIT_EXACT = Capability.CPU_BIT_EXACT
FACTORED_V = Capability.FACTORED_V
DCP_RESHARD = Capability.DCP_RESHARD
DCP_SAVE_PLANNER = Capability.DCP_SAVE_PLANNER
DCP_ASYNC_SAVE = Capability.DCP_ASYNC_SAVE

KNOWN_CAPABILITIES = frozenset(Capability)

#: Constructor options outside the suite's scope (SPEC 1.1.5): an implementation MAY implement them
#: and says so in ``Implementation.extended_options``; one it does not declare it MUST refuse (SPEC
#: 1.1.2 rows 8-10), never accept and ignore. The suite certifies neither their semantics nor, for a
#: declared option, its refusal.
EXTENDED_OPTIONS = frozenset({"capturable", "codebook_refresh_every", "stochastic_round"})

#: What each capability claims, in words (docs/independent.md's capability table is generated from
#: this and from the suite's ``gefen_requires`` marks: tools/doc_tables.py).
CAPABILITY_CLAIMS = {
    Capability.NATIVE_STATE_DICT: "`state_dict()`/`load_state_dict()` in the published native format "
    "(SPEC 1.11-1.12); "
    "pinned steps start from the reference's state loaded this way (SPEC 5.6.1), and "
    "without it long runs are judged free-running (SPEC 5.6.21)",
    Capability.CPU_BIT_EXACT: "bitwise equal to the reference on CPU (SPEC 0.4.1): the run is judged "
    "by the torch-exact "
    "profile; without it, or off the CPU, by the tolerance profile (SPEC 0.4.3, 4.6.4)",
    Capability.FACTORED_V: "the factored second moment, `factored_v_2d=True` (SPEC 1.9)",
    Capability.DCP_RESHARD: "the DCP adapter, `dcp_state()`: saves and restores across world sizes "
    "(Parts 2-3); every "
    "DCP scenario goes through it",
    Capability.DCP_SAVE_PLANNER: "`save_planner()` returns a memory-bounded planner (SPEC 2.5)",
    Capability.DCP_ASYNC_SAVE: "`async_writer()` supports `dcp.async_save` (SPEC 2.6)",
}


def as_capabilities(values: Iterable[Capability | str]) -> frozenset:
    """``values`` as a frozenset of :class:`Capability` members (ValueError on an unknown tag)."""
    return frozenset(Capability.parse(v) for v in values)


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

    ``thread_safe`` (default True) says that the implementation may run in several threads of one
    process at once, each its own rank (its optimizers, adapters and kernels share no mutable
    state across instances without a lock). The scenarios at scale run their ranks as threads of
    one process (:mod:`gefen_conformance.harness.threads`); an implementation that sets it False is
    run there on the active launcher instead, one process per rank, and the test says why.

    ``extended_options`` names the constructor options outside the suite's scope the
    implementation implements (:data:`EXTENDED_OPTIONS`, SPEC 1.1.5): the refusal of each other
    one is certified (SPEC 1.1.2 rows 8-10); a declared one is neither refused nor certified, and
    the certificate records the declaration.
    """

    name: str
    version: str
    make_optimizer: Callable[..., Any]
    dcp_state: Callable[[Any], Any] | None = None
    save_planner: Callable[[], Any] | None = None
    async_writer: Callable[[str], Any] | None = None
    capabilities: frozenset = frozenset()
    expected_failures: Mapping[str, str] = field(default_factory=dict)
    prepare: Callable[[Any], None] | None = None
    thread_safe: bool = True
    extended_options: frozenset = frozenset()

    def __post_init__(self):
        if not self.name or not isinstance(self.name, str):
            raise ValueError("an implementation needs a non-empty name")
        if not callable(self.make_optimizer):
            raise TypeError(f"implementation {self.name!r}: make_optimizer must be callable")
        if self.prepare is not None and not callable(self.prepare):
            raise TypeError(f"implementation {self.name!r}: prepare must be callable (or None)")
        if not isinstance(self.thread_safe, bool):
            raise TypeError(f"implementation {self.name!r}: thread_safe must be a bool")
        if isinstance(self.capabilities, (str, Capability)):
            raise TypeError(
                f"implementation {self.name!r}: capabilities must be a collection of capabilities, "
                f"not the single {str(self.capabilities)!r}"
            )
        known = {c.value for c in Capability}
        unknown = sorted(str(c) for c in self.capabilities if str(c) not in known)
        if unknown:
            raise ValueError(
                f"implementation {self.name!r} declares unknown capabilities {unknown} "
                f"(known: {', '.join(sorted(known))})"
            )
        if isinstance(self.extended_options, str):
            raise TypeError(
                f"implementation {self.name!r}: extended_options must be a collection of option names, "
                f"not the single {self.extended_options!r}"
            )
        unknown = sorted(str(o) for o in self.extended_options if o not in EXTENDED_OPTIONS)
        if unknown:
            raise ValueError(
                f"implementation {self.name!r} declares unknown extended options {unknown} "
                f"(known: {', '.join(sorted(EXTENDED_OPTIONS))})"
            )
        object.__setattr__(self, "extended_options", frozenset(self.extended_options))
        missing = [k for k, why in self.expected_failures.items() if not str(why).strip()]
        if missing:
            raise ValueError(f"implementation {self.name!r}: expected failures without a reason: {missing}")
        object.__setattr__(self, "capabilities", as_capabilities(self.capabilities))

    def has(self, capability: Capability | str) -> bool:
        return Capability.parse(capability) in self.capabilities

    def lacks(self, required: Iterable[Capability | str]) -> list:
        """The capabilities of ``required`` this implementation does not declare, in order."""
        return [c for c in map(Capability.parse, required) if c not in self.capabilities]

    @property
    def spec(self) -> str:
        """The ``--impl`` spec this implementation was resolved under (its name when built directly)."""
        return self.__dict__.get("_spec") or self.name

    def resolved_as(self, spec: str, resolve) -> None:
        """Remember the spec ``resolve`` (``registry.resolve``) found this implementation under: it
        then pickles as that spec, and unpickles as the receiving process's own ``resolve(spec)``."""
        object.__setattr__(self, "_spec", spec)
        object.__setattr__(self, "_resolve", resolve)

    def __reduce_ex__(self, protocol):
        spec = self.__dict__.get("_spec")
        if spec is None:
            return super().__reduce_ex__(protocol)
        return (self.__dict__["_resolve"], (spec,))

"""Optimizer-level facts the DCP adapter reads (and, on load, writes).

Everything the adapter needs from the optimizer object itself, as opposed to
its ``param_groups`` and per-parameter ``state``, goes through this module, so
the rest of the adapter never names an attribute of a particular optimizer
class. Only :class:`reference.optimizer.Gefen` is supported; it exposes these
facts as public attributes (``codebook``, ``global_step``, ``deterministic``,
``factored_v_2d``).
"""

from __future__ import annotations

import re

# Spellings the optimizer generates for a parameter the caller did not name.
# Consulted only when a group carries no provenance flags at all: a caller may
# legitimately call a parameter "param_0", so spelling is a last resort.
_POSITIONAL_SPELLING = re.compile(r"^(group_\d+_param_\d+|param_\d+)$")


def supported_class():
    """The one optimizer class the adapter accepts (imported on demand)."""
    from reference.optimizer import Gefen

    return Gefen


def is_supported(optimizer) -> bool:
    """Exact-type test: subclasses may change the state layout, so they are refused."""
    return type(optimizer) is supported_class()


def codebook_of(optimizer):
    """The rank's shared 256-entry momentum codebook, or None before step 1."""
    return optimizer.codebook


def global_step_of(optimizer):
    """The optimizer-wide step counter."""
    return optimizer.global_step


def deterministic_of(optimizer) -> bool:
    return bool(optimizer.deterministic)


def factored_v_2d_of(optimizer) -> bool:
    return bool(getattr(optimizer, "factored_v_2d", False))


def capturable_of(optimizer) -> bool:
    # The reference optimizer has no capturable mode; the check stays so that a
    # future optimizer that grows one is refused rather than misread.
    return bool(getattr(optimizer, "capturable", False))


def name_is_synthesized(group, position: int) -> bool:
    """Whether the optimizer made up the name of ``group["params"][position]``.

    The group's ``param_names_synthesized`` list records this at registration.
    A group without that record falls back to the positional spelling, which
    errs on the side of refusing.
    """
    flags = group.get("param_names_synthesized")
    if flags is not None and position < len(flags):
        return bool(flags[position])
    names = group.get("param_names") or ()
    name = names[position] if position < len(names) else ""
    return bool(_POSITIONAL_SPELLING.match(str(name)))


def period_rules_of(optimizer):
    """The optimizer's force-period-one rules (a ``reference.periods.PeriodRules``)."""
    return optimizer.period_rules


def replace_state(optimizer, new_state: dict) -> None:
    """Replace the whole per-parameter state (load side) with ``new_state``.

    The state mapping object itself is kept (cleared and refilled), so anything
    holding a reference to ``optimizer.state`` sees the restored state.
    """
    optimizer.state.clear()
    optimizer.state.update(new_state)


def set_codebook(optimizer, codebook) -> None:
    """Install a codebook (load side). ``None`` means "learn on the next step"."""
    optimizer.codebook = codebook


def set_global_step(optimizer, value: int) -> None:
    optimizer.global_step = int(value)


__all__ = [
    "supported_class",
    "is_supported",
    "codebook_of",
    "global_step_of",
    "deterministic_of",
    "factored_v_2d_of",
    "capturable_of",
    "name_is_synthesized",
    "period_rules_of",
    "replace_state",
    "set_codebook",
    "set_global_step",
]

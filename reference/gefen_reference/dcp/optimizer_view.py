"""Optimizer-level facts the DCP adapter reads (and, on load, writes).

Everything the adapter needs from the optimizer object itself, as opposed to
its ``param_groups`` and per-parameter ``state``, goes through this module, so
the rest of the adapter never names an attribute of a particular optimizer
class.

Which optimizers the adapter accepts (SPEC 2.3.1, 2.3.6): exactly
:class:`gefen_reference.optimizer.Gefen`, and any class that declares the reference's
state layout protocol by setting, in its own class body (an inherited value does
not count, so a subclass that changes the layout is still refused)::

    gefen_state_layout = reference.dcp.STATE_LAYOUT

The declaration is the class author's promise that its instances are, between
calls to ``step()``, indistinguishable from a ``gefen_reference.Gefen`` as far as this
module and the adapter can look:

* public attributes ``codebook`` (fp32[256] or None), ``global_step`` (int),
  ``deterministic`` (bool), ``factored_v_2d``, ``period_rules`` (a
  ``gefen_reference.periods.PeriodRules``) and, if it has one, ``capturable``;
* ``param_groups`` with ``param_names`` and ``param_names_synthesized`` (SPEC 1.3)
  and the hyperparameter keys of SPEC 1.11.2;
* per-parameter ``state`` entries with the keys, dtypes, shapes and devices of
  SPEC 1.11.3 (compact block momentum, block ``vmean``);
* the adapter may replace ``state`` (refilling the same mapping), ``codebook``
  and ``global_step`` on load, and the optimizer's next step must use what it
  finds there: nothing derived from them may be cached without checking it is
  still current.
"""

from __future__ import annotations

import re

# Spellings the optimizer generates for a parameter the caller did not name.
# Consulted only when a group carries no provenance flags at all: a caller may
# legitimately call a parameter "param_0", so spelling is a last resort.
_POSITIONAL_SPELLING = re.compile(r"^(group_\d+_param_\d+|param_\d+)$")


#: The value a class sets as ``gefen_state_layout`` to declare the protocol above.
STATE_LAYOUT = "gefen-reference-state-layout/1"
#: The class attribute that carries the declaration.
LAYOUT_ATTRIBUTE = "gefen_state_layout"


def supported_class():
    """The reference optimizer class, always accepted (imported on demand)."""
    from gefen_reference.optimizer import Gefen

    return Gefen


def declares_state_layout(cls) -> bool:
    """Whether ``cls`` itself (not a base class) declares the reference's state layout."""
    return vars(cls).get(LAYOUT_ATTRIBUTE) == STATE_LAYOUT


def is_supported(optimizer) -> bool:
    """Exactly ``gefen_reference.Gefen``, or a class that declares the state layout (SPEC 2.3.6).

    Undeclared subclasses are refused: a subclass may change the state layout.
    """
    cls = type(optimizer)
    return cls is supported_class() or declares_state_layout(cls)


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
    """The optimizer's force-period-one rules (a ``gefen_reference.periods.PeriodRules``)."""
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
    "LAYOUT_ATTRIBUTE",
    "STATE_LAYOUT",
    "declares_state_layout",
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

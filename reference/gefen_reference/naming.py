"""Parameter names and their provenance (SPEC 1.3).

Names are lowercase strings. A caller-supplied name is kept as given (lowercased,
never de-duplicated); a name the optimizer makes up is flagged *synthesized* and
made unique among the names registered so far with ``_1``, ``_2``, ... suffixes.
The flag travels with checkpoints: the DCP adapter only trusts names a caller gave.
"""

from __future__ import annotations


def unique_name(base: str, taken: set[str]) -> str:
    """``base`` lowercased, or with the smallest ``_k`` suffix (k >= 1) that is not taken."""
    name = str(base).lower()
    if name not in taken:
        return name
    k = 1
    while f"{name}_{k}" in taken:
        k += 1
    return f"{name}_{k}"


def name_group_params(
    given: list[object | None],
    *,
    group_name: object | None,
    implicit_group: bool,
    group_index: int,
    registered_count: int,
    taken: set[str],
) -> tuple[list[str], list[bool]]:
    """Names and synthesized flags for the params of one new group (SPEC 1.3.2-1.3.3).

    ``given`` holds each param's caller name or None. ``registered_count`` is how many
    params earlier groups registered; ``taken`` the names they hold (not mutated).
    """
    taken = set(taken)
    names: list[str] = []
    flags: list[bool] = []
    for index, caller_name in enumerate(given):
        if caller_name is not None:
            name, synthesized = str(caller_name).lower(), False
        elif group_name is not None and len(given) == 1:
            base = str(group_name).lower()
            name = unique_name(base, taken)
            synthesized = name != base
        elif implicit_group:
            name, synthesized = unique_name(f"param_{registered_count + index}", taken), True
        else:
            name, synthesized = unique_name(f"group_{group_index}_param_{index}", taken), True
        names.append(name)
        flags.append(synthesized)
        taken.add(name)
    return names, flags


def reconcile_flags(
    new_names: list[str],
    live_names: list[str],
    live_flags: list[bool],
    checkpoint_flags: list | None,
) -> list[bool]:
    """Provenance after a native load (SPEC 1.3.6).

    An unchanged name keeps its live flag; a changed name takes the checkpoint's flag;
    without a usable checkpoint flag list the name counts as synthesized (fail closed).
    """
    usable = isinstance(checkpoint_flags, (list, tuple)) and len(checkpoint_flags) == len(new_names)
    flags = []
    for i, name in enumerate(new_names):
        if i < len(live_names) and live_names[i] == name:
            flags.append(bool(live_flags[i]))
        elif usable:
            flags.append(bool(checkpoint_flags[i]))
        else:
            flags.append(True)
    return flags

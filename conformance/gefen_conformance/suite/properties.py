"""How the suite's hypothesis properties run (SPEC 4.3.9, 4.3.10): a table of explicit examples
first, then a share of the hypothesis profile's drawn examples.

A property module keeps its tables in a data module and applies them with :func:`with_examples`;
:func:`share_of_profile` sets how many examples are drawn after them.
"""

from __future__ import annotations

from collections.abc import Mapping

from hypothesis import HealthCheck, example, settings


def share_of_profile(share: int):
    """Run one ``share``-th of the profile's examples (at least one). The test's judge spans every
    example (it keeps each comparison's worst margin over all of them), so the function-scoped
    fixture check is off."""
    return settings(
        max_examples=max(1, settings.default.max_examples // share),
        suppress_health_check=[HealthCheck.function_scoped_fixture],
    )


def with_examples(table: Mapping, *names: str):
    """Every entry of ``table`` as an explicit example, in the table's order. With one name each
    entry is that argument; with several, each entry is a tuple of them in that order."""

    def decorate(test):
        for entry in reversed(list(table.values())):
            values = entry if len(names) > 1 else (entry,)
            test = example(**dict(zip(names, values, strict=True)))(test)
        return test

    return decorate

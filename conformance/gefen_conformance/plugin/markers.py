"""The suite's two markers, prefixed so that they never meet another project's (SPEC 4.1.5).

``@pytest.mark.gefen_clause(*ids)`` names the SPEC clauses a suite test checks (a suite test
without one is a collection error); ``@pytest.mark.gefen_requires(*capabilities)`` skips a test
unless the implementation declares every capability (SPEC 4.1.3);
``@pytest.mark.gefen_tier(name)`` puts a test in a tier past the default one (SPEC 4.3.16): it is
part of the suite only in a run of that tier. They are registered only in a session that collects
the suite (by ``gefen_conformance.plugin.fixtures``), never in another project's.
"""

from __future__ import annotations

CLAUSE = "gefen_clause"
REQUIRES = "gefen_requires"
TIER = "gefen_tier"

_DESCRIPTIONS = {
    CLAUSE: f"{CLAUSE}(*ids): the SPEC clauses a conformance test checks",
    REQUIRES: f"{REQUIRES}(*capabilities): skip unless the implementation under test declares them",
    TIER: f"{TIER}(name): part of the suite only in a run of that tier (--gefen-tier)",
}


def register(config) -> None:
    """Make the markers known to ``config`` (``--strict-markers`` accepts them, ``--markers`` lists them)."""
    for line in _DESCRIPTIONS.values():
        config.addinivalue_line("markers", line)


def clauses(item) -> list[str]:
    """The SPEC clauses ``item`` names, in marker order."""
    return [str(c) for m in item.iter_markers(CLAUSE) for c in m.args]


def tier(item) -> str:
    """The tier ``item`` belongs to: its ``gefen_tier`` mark's, else ``default``."""
    mark = item.get_closest_marker(TIER)
    return str(mark.args[0]) if mark is not None else "default"


def required(item) -> list[str]:
    """The capabilities ``item`` requires (strings, as the marks hold them)."""
    return [str(c) for m in item.iter_markers(REQUIRES) for c in m.args]


def off_device(item) -> str | None:
    """Why a test that requires ``cpu-bit-exact`` does not run on the run's device (SPEC 4.6.4),
    or None: bitwise claims are judged on CPU only."""
    from gefen_conformance.harness import devices
    from gefen_conformance.implementations.contract import CPU_BIT_EXACT

    device = devices.selected()
    if device.type == "cpu" or CPU_BIT_EXACT not in required(item):
        return None
    return f"{CPU_BIT_EXACT} is judged on CPU only; device {device} is judged by tolerance (SPEC 4.6.4)"

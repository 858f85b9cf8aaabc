"""The implementation's saves of the golden catalogue against the committed goldens (SPEC 5.5)."""

from __future__ import annotations

import pytest

from conformance import golden
from conformance.implementation import DCP_RESHARD


@pytest.mark.clause("5.5.3", "2.2.5")
@pytest.mark.requires(DCP_RESHARD)
def test_saves_match_the_goldens(impl, request):
    if request.config.getoption("--golden-regen"):
        path = golden.generate_into(golden.GOLDEN_DIR, "reference")
        pytest.fail(f"goldens regenerated from the reference into {path.parent}; review and commit them, then rerun")
    problems = golden.compare_with_goldens(request.config.getoption("--impl"))
    assert not problems, "\n".join(problems)

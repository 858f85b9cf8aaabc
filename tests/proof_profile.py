"""A pytest plugin for the proofs' partial certifications: the hypothesis profile ``gefen-proof``.

It is ``gefen-certify`` without the shrink and explain phases. Those run only after a test has
failed, to report a smaller failing example; they never decide whether a test fails, and a proof
reads only which tests failed. A mutant caught by a property therefore fails the same tests
under both profiles, and the proof skips the minutes hypothesis spends shrinking every catch.
The profile is registered when pytest imports this module (``-p tests.proof_profile``), before
hypothesis's own plugin loads the profile ``--hypothesis-profile`` names.
"""

from __future__ import annotations

from hypothesis import Phase, settings

from gefen_conformance.plugin import hypothesis_profiles

NAME = "gefen-proof"

hypothesis_profiles.register()
_CERTIFY = settings.get_profile(hypothesis_profiles.CERTIFY)
settings.register_profile(
    NAME, _CERTIFY, phases=[p for p in _CERTIFY.phases if p not in (Phase.shrink, Phase.explain)]
)

#: the arguments that run a suite session under this profile
ARGS = ("-p", "tests.proof_profile", f"--hypothesis-profile={NAME}")

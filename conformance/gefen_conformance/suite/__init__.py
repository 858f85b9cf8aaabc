"""The conformance suite: collected by ``pytest --pyargs gefen_conformance --impl=NAME``.

Every test names its SPEC clause with ``@pytest.mark.gefen_clause``; tests that need an optional
capability say so with ``@pytest.mark.gefen_requires``.
"""

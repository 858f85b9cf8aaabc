"""A pytest plugin for a collection of the suite: writes the rule ids and clauses each collected
test names in its ``gefen_clause`` marks, as JSON ``{nodeid: [clause, ...]}``, to the file
``GEFEN_CLAUSE_DUMP`` names. It sees every collected test, before any deselection."""

from __future__ import annotations

import json
import os

import pytest


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_collection_modifyitems(session, config, items):
    named = {
        item.nodeid: [str(c) for mark in item.iter_markers("gefen_clause") for c in mark.args]
        for item in items
    }
    with open(os.environ["GEFEN_CLAUSE_DUMP"], "w", encoding="utf-8") as out:
        json.dump(named, out)
    yield

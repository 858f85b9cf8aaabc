"""The documentation's capability, gefen-x expected-failure and tolerance tables (docs/independent.md,
docs/gefenx.md, docs/tolerance.md) are the ones the code and the committed certificates give
(tools/doc_tables.py): a change to a capability, a ``gefen_requires`` mark, an expected failure or a
bound that leaves a page behind fails here."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _tables():
    spec = importlib.util.spec_from_file_location("doc_tables", REPO / "tools" / "doc_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_doc_tables_are_current():
    tables = _tables()
    stale = {
        str(page.relative_to(REPO)): tables.stale(page.read_text(encoding="utf-8"), tables.tables_of(page))
        for page in set(tables.PAGES.values())
    }
    stale = {page: names for page, names in stale.items() if names}
    assert not stale, f"stale generated tables {stale}: run {tables.COMMAND}"


def test_every_table_has_a_page():
    assert set(_tables().PAGES) == set(_tables().TABLES)


def test_a_changed_table_is_found_stale():
    tables = _tables()
    page = tables.PAGES["capabilities"]
    names = tables.tables_of(page)
    text = tables.render(page.read_text(encoding="utf-8"), names)
    assert tables.stale(text, names) == []
    assert tables.stale(text.replace("`dcp-async-save`", "`dcp-async`", 1), names) == ["capabilities"]


def test_every_capability_gates_the_modules_its_marks_name():
    gated = _tables().required_by_module()
    assert "test_dcp_async.py" in gated["dcp-async-save"] and "test_dcp_reshard.py" in gated["dcp-reshard"]
    assert gated["cpu-bit-exact"] == ["test_dcp_payload.py", "test_dcp_scale.py"]


def test_the_gefenx_certificate_fails_exactly_the_declared_expected_failures():
    from gefen_conformance.implementations.gefenx import EXPECTED_FAILURES

    cert = json.loads((REPO / "certificates" / "gefenx-0.5.0.json").read_text(encoding="utf-8"))
    from gefen_conformance.suite.test_training_stack import PATHS

    xfailed = {t["id"]: t["reason"] for t in cert["tests"] if t["outcome"] == "xfailed"}
    # the certificate is of the default tier: the stack's scale-tier paths are not in it, nor stale
    scale_tier = {
        f"test_training_stack.py::test_stack_resumes_like_the_reference[{path.id}]"
        for path in PATHS
        if any(mark.name == "gefen_tier" for mark in path.marks)
    }
    assert scale_tier and set(xfailed) == set(EXPECTED_FAILURES) - scale_tier
    assert cert["stale_expected_failures"] == []

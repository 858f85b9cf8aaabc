"""The HTML report laid out by a real browser (SPEC 4.5.2): headless Chromium at 800 and 1400 px.

For each width the page never scrolls sideways, what did not pass starts above the fold, every
test name of the failures and of the chart is laid out visibly (no hover needed) inside the
viewport, and the chart has a row for every clause. The measurements are taken in the page's DOM
by a script the test appends to its own copy of the report (the report itself carries no script,
and its Content-Security-Policy would block one, so the copy drops that one meta tag).

Chromium comes from the distribution's packages (``.ci/run`` installs it); where none can be
installed the test skips, naming that.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gefen_conformance.certificate import problems, report, report_model
from gefen_conformance.certificate import read as certificate_read

FIXTURES = Path(__file__).parent / "fixtures" / "certificates"
BROWSER = next(
    (shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None
)
HEIGHT = 900

pytestmark = pytest.mark.skipif(
    BROWSER is None, reason="no Chromium on this machine (Debian: apt-get install chromium)"
)

MEASURE = """<script>
(() => {
  const box = e => {
    const r = e.getBoundingClientRect();
    return {left: r.left, right: r.right, top: r.top, bottom: r.bottom, width: r.width, height: r.height};
  };
  const heading = document.getElementById('not-passed');
  const out = {
    viewport: innerWidth, height: innerHeight, scroll_width: document.documentElement.scrollWidth,
    not_passed: heading ? box(heading) : null,
    problem_names: [...document.querySelectorAll('ol.problems li > code')]
        .map(e => ({text: e.textContent, box: box(e)})),
    chart_names: [...document.querySelectorAll('.cdesc code')].map(e => ({text: e.textContent, box: box(e)})),
    chart_labels: [...document.querySelectorAll('.chart .clab[title]')].map(e => e.title),
    wider_than_their_box: [...document.querySelectorAll('.clab, .cdesc, code, pre, td, th')]
        .filter(e => e.scrollWidth > e.clientWidth + 1)
        .map(e => e.className + ':' + e.textContent.slice(0, 40)),
  };
  const pre = document.createElement('pre'); pre.id = 'gefen-measure'; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>"""


def _measure(page: str, width: int, tmp_path: Path) -> dict:
    probe = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", page).replace(
        "</body>", MEASURE + "</body>"
    )
    path = tmp_path / f"report-{width}.html"
    path.write_text(probe, encoding="utf-8")
    command = [
        BROWSER,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        f"--user-data-dir={tmp_path / 'profile'}",
        f"--window-size={width},{HEIGHT}",
        "--dump-dom",
        path.as_uri(),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    found = re.search(r'<pre id="gefen-measure">(.*?)</pre>', done.stdout, flags=re.S)
    assert found, f"Chromium printed no measurement (exit {done.returncode}): {done.stderr[-1500:]}"
    import html

    return json.loads(html.unescape(found.group(1)))


def _failing_certificate() -> dict:
    """A not-conformant run with a long parametrized id, an expected failure and a rank failure."""
    cert = certificate_read.load(FIXTURES / "mutant-beta-rounding.json")
    xfail = dict(
        cert["tests"][0],
        outcome="xfailed",
        reason="documented difference (SPEC 3.9): reads any non-zero flag as 1",
    )
    cert["tests"].append(xfail)
    return cert


@pytest.mark.parametrize("width", [800, 1400])
@pytest.mark.parametrize("name", ["failing", "fast-run1.json"])
def test_the_report_fits_the_width_and_leads_with_what_did_not_pass(tmp_path, width, name):
    cert = _failing_certificate() if name == "failing" else certificate_read.load(FIXTURES / name)
    m = _measure(report.render(cert, "html", "cert.json"), width, tmp_path)
    assert m["viewport"] == width
    assert m["scroll_width"] <= width, f"the page scrolls sideways: {m['scroll_width']} px wide at {width}"
    assert not m["wider_than_their_box"], m["wider_than_their_box"][:5]
    failing = problems.not_passed(cert)
    if failing:
        assert m["not_passed"]["top"] < m["height"] / 2, m["not_passed"]
        first = m["problem_names"][0]["box"]
        assert first["bottom"] <= m["height"], "the first failure is below the fold"
    assert [p["text"] for p in m["problem_names"]] == [
        p.test for p in failing + problems.not_passed(cert, expected=True)
    ]
    for named in m["problem_names"] + m["chart_names"]:
        box = named["box"]
        assert box["width"] > 0 and box["height"] > 0 and box["left"] >= 0 and box["right"] <= width, named
    chart_clauses = sorted(c for label in m["chart_labels"] for c in label.split(", "))
    assert chart_clauses == sorted(r.clause for r in report_model.clause_rows(cert))

"""``gefen-conformance report``: Markdown and self-contained HTML of a schema-2 certificate (SPEC 4.5)."""

from __future__ import annotations

import copy
import html
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from gefen_conformance import cli
from gefen_conformance.certificate import problems, report, report_model
from gefen_conformance.certificate import read as certificate_read
from gefen_conformance.certificate.report_html import margin_chart

FIXTURES = Path(__file__).parent / "fixtures" / "certificates"
NAMES = sorted(p.name for p in FIXTURES.glob("*.json"))
HOSTILE = "evil|<script>alert(1)</script>\n&amp;`x`*y*[z](javascript:1)\x01</svg>"


def load(name):
    return certificate_read.load(FIXTURES / name)


def hostile_certificate():
    cert = copy.deepcopy(load("fast-run1.json"))
    cert["implementation"]["name"] = HOSTILE
    cert["implementation"]["capabilities"].append(HOSTILE)
    cert["verdict_reason"] = HOSTILE
    cert["notes"].append(HOSTILE)
    cert["capability_skips"][HOSTILE] = 1
    failing = cert["tests"][0]
    failing.update(outcome="failed", reason=HOSTILE, id=HOSTILE + "::test")
    failing["margins"].append({"what": HOSTILE, "kind": "tolerance", "error": 1.0, "bound": 2.0, "used": 0.5})
    cert["clauses"][HOSTILE] = {"passed": 0, "failed": 1}
    failing["clauses"].append(HOSTILE)
    return cert


def test_fixtures_are_what_the_generator_writes():
    import importlib.util

    spec = importlib.util.spec_from_file_location("generate_fixtures", FIXTURES / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    made = module.fixtures()
    assert sorted(made) == NAMES
    for name, cert in made.items():
        assert json.loads(json.dumps(cert)) == json.loads((FIXTURES / name).read_text()), name


def test_clause_order_is_numeric():
    clauses = ["1.10.1", "1.9", "1.11", "1.8.8", "2.1", "1.10", "10.1", "x"]
    assert sorted(clauses, key=certificate_read.clause_key) == [
        "1.8.8",
        "1.9",
        "1.10",
        "1.10.1",
        "1.11",
        "2.1",
        "10.1",
        "x",
    ]


# --- Markdown --------------------------------------------------------------------------------------


def test_markdown_states_what_was_certified_where_and_how_completely():
    md = report.render(load("fast-run1.json"), "md")
    for expected in (
        "fast 0.3.0",
        "dcp-reshard, dcp-save-planner, native-state-dict",
        "tolerance (cpu-bit-exact not declared)",
        "parameters bfloat16: rtol 0.02, atol 0.02",
        "continuation\\_after\\_reshard: max\\_abs 0.005",
        "world sizes 1, 2, 4",
        "gloo",
        "content sha256 3f1c9a0be27d",
        "git 17ca9a6b2e0c",
        "torch 2.13.0+cpu",
        "**Verdict: conformant-with-expected-failures**",
        "2 expected failures",
        "13 of 13 expected tests executed, complete",
        "profile gefen-certify",
    ):
        assert expected in md, expected
    assert "| dcp-async-save | 1 |" in md and "| factored-v | 2 |" in md
    assert "golden md5s not compared" in md
    xfail = "documented difference (SPEC 3.9): fast reads any non-zero initialized flag as 1"
    assert md.count(xfail) == 1 and "## Expected failures (2)" in md
    assert "## Did not pass" not in md


def test_markdown_clause_table_in_numeric_order_with_worst_margin_and_its_test():
    md = report.render(load("fast-run2-drift.json"), "md")
    rows = [line for line in md.splitlines() if re.match(r"\| \d+\.\d", line)]
    clauses = [row.split(" | ")[0][2:] for row in rows]
    assert clauses == sorted(clauses, key=certificate_read.clause_key)
    assert clauses.index("1.9") < clauses.index("1.10.1") < clauses.index("1.11")
    row_18 = next(r for r in rows if r.startswith("| 1.8 |"))
    assert (
        "93 % | ` test_optimizer.py::test_block_step_matches_reference[torch.bfloat16-wd-tensor-lr] `"
        in row_18
    )
    row_19 = next(r for r in rows if r.startswith("| 1.9 |"))
    assert row_19.split(" | ")[1:7] == ["0", "0", "0", "1", "0", "0"]  # passed .. xpassed: one skipped


def test_markdown_lists_failed_tests_with_reasons_and_bitwise_counts():
    md = report.render(load("mutant-beta-rounding.json"), "md")
    assert "**Verdict: not-conformant**" in md and "## Did not pass (4)" in md
    assert "rank 2: RuntimeError: slot 1 of 'w' has 3 codewords, expected 4" in md
    # the reason's first line leads; the full reason stays in the certificate
    assert (
        "| AssertionError: parameter w: 311 of 4096 elements differ bitwise |" in md and "first at" not in md
    )
    assert "| 1.8 | 0 | 2 | 0 | 0 | 0 | 0 | bitwise: 408 of 6,144 differ |" in md
    assert "620 % (outside its bound)" in md


def test_markdown_puts_the_rules_line_under_the_verdict_and_lists_the_rules_by_status():
    cert = load("mutant-beta-rounding.json")
    section = cert["rules"]
    lines = report.render(cert, "md").splitlines()
    verdict = next(i for i, line in enumerate(lines) if line.startswith("**Verdict: "))
    assert lines[verdict + 2] == report.md_text(f"**rules: {section['summary']}**").replace("\\*", "*")
    assert " rules certified; " in lines[verdict + 2] and "; 5 failed; " in lines[verdict + 2]
    at = lines.index("## Rules by status")
    assert at < lines.index("## Clauses named by tests") and "## Clauses" not in lines
    table = lines[at + 4 :]
    table = table[: next(i for i, line in enumerate(table) if not line.startswith("|"))]
    rows = {_cells(line)[0].strip(): _cells(line)[1:] for line in table}
    assert rows["failed"] == [
        " 5 ",
        " 2.4.5; 3.1.2; 3.4.4; 3.7.1; 3.7.3 ",
    ]  # the failing reshard tests' rules
    assert rows["checked by no test of this run"][0].strip() == str(section["counts"]["unchecked"])
    not_certified = next(k for k in rows if k.startswith("not certified by this suite: reference-only"))
    assert rows[not_certified] == [" 1 ", " 1.6.10 "]
    assert "skipped for a missing capability" not in rows  # no rule was only skipped
    assert set(rows["certified"][1].strip().split("; ")) == set(section["ids"]["certified"])
    unproven = rows.get("checked without a mutant proof", [" 0 "])  # no row for a status none has
    assert unproven[0].strip() == str(section["counts"]["unproven"])


def test_a_report_of_a_certificate_without_rules_says_it_counts_none():
    cert = load("reference-run1.json")
    cert.pop("rules")
    md = report.render(cert, "md")
    assert "rules: not recorded (a certificate written before SPEC 0.2.4 counts no rules)" in md
    assert "## Rules by status" not in md
    assert "not recorded" in report.render(cert, "html")


def test_markdown_of_a_partial_run_says_what_narrowed_it():
    md = report.render(load("reference-partial.json"), "md")
    assert "**Verdict: partial**" in md
    assert "7 of 13 expected tests executed, not complete, narrowed by -k optimizer" in md


def _cells(row: str) -> list:
    return re.split(r"(?<!\\)\|", row)[1:-1]


def test_markdown_escapes_hostile_strings_and_keeps_every_row_whole():
    md = report.render(hostile_certificate(), "md")
    # inside a code span text is literal (no markup, no links); everywhere else it is escaped
    plain = re.sub(r"(`+) .*? \1", "", md)
    assert (
        "<script" not in plain
        and "&lt;script>" in plain
        and "evil\\|&lt;script>alert(1)&lt;/script><br>&amp;amp;" in plain
    )
    assert "[z](javascript" not in plain and "\\[z\\](javascript" in plain
    for table in re.findall(r"((?:^\|.*\|$\n?)+)", md, flags=re.M):
        lines = table.strip().splitlines()
        widths = {len(_cells(line)) for line in lines}
        assert len(widths) == 1, lines
    assert "\x01" not in md and "\\x01" in md


# --- HTML ------------------------------------------------------------------------------------------

ALLOWED_TAGS = {
    "html",
    "head",
    "meta",
    "title",
    "style",
    "body",
    "h1",
    "h2",
    "span",
    "div",
    "table",
    "thead",
    "tbody",
    "tr",
    "th",
    "td",
    "code",
    "pre",
    "p",
    "i",
    "b",
    "ul",
    "ol",
    "li",
    "br",
    "details",
    "summary",
    "abbr",
}


class TagCollector(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.attributes, self.text = [], set(), []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attributes |= {name for name, _ in attrs}

    def handle_data(self, data):
        self.text.append(data)


def chart_labels(page: str) -> list:
    return [html.unescape(t) for t in re.findall(r'<div class="clab" title="([^"]*)">', page)]


@pytest.mark.parametrize("name", NAMES)
def test_html_is_self_contained_and_its_chart_has_every_clause(name):
    cert = load(name)
    page = report.render(cert, "html", name)
    for outside in (
        "http:",
        "https:",
        "src=",
        "href=",
        "<script",
        "url(",
        "@import",
        "<link",
        "<img",
        "<iframe",
    ):
        assert outside not in page.lower(), outside
    assert "default-src 'none'" in page
    parser = TagCollector()
    parser.feed(page)
    assert set(parser.tags) <= ALLOWED_TAGS
    assert not {a for a in parser.attributes if a.startswith("on")}
    charted = sorted(c for label in chart_labels(page) for c in label.split(", "))
    assert charted == sorted(r.clause for r in report_model.clause_rows(cert))
    for clause in cert["clauses"]:
        assert f"<td>{clause}</td>" in page


def test_html_chart_puts_the_clause_closest_to_its_bound_first_and_colours_it():
    cert = load("fast-run2-drift.json")
    rows = report_model.chart_rows(cert)
    assert rows[0].kind == "margin" and rows[0].clauses == [
        "1.4",
        "1.8",
        "1.10.1",
    ]  # 93 %: one comparison, one row
    page = report.render(cert, "html")
    assert chart_labels(page)[0] == "1.4, 1.8, 1.10.1"
    bars = re.findall(r'<div class="bar" style="width:([\d.]+)%;background:(#\w+)">', page)
    assert bars[0] == (f"{100 * 0.93 / 1.25:.2f}", "#e8590c")  # 90 to 100 % of the bound
    assert {fill for _, fill in bars[1:]} <= {"#2f9e44", "#f59f00"}


def test_html_chart_shows_failed_clauses_outside_their_bound_and_without_a_comparison():
    cert = load("mutant-beta-rounding.json")
    rows = report_model.chart_rows(cert)
    kinds = [r.kind for r in rows]
    assert kinds[:3] == ["margin", "bitwise", "failed"]
    assert (
        rows[0].used == pytest.approx(6.2) and "5.3.3" in rows[0].clauses
    )  # clipped at 125 %: a marker says it goes on
    assert rows[1].bitwise_differing == 408 and rows[1].clauses == ["1.4", "1.8", "1.10.1"]
    assert (
        rows[2].test.startswith("test_dcp_reshard.py::") and "2.4.5" in rows[2].clauses
    )  # errored, no comparison
    page = report.render(cert, "html")
    assert "620 % of the bound: outside it" in page and "&#9654;" in page
    assert "failed without a numeric comparison" in page and "bitwise: 408 of 6,144 elements differ" in page


def test_html_leads_with_what_did_not_pass_and_keeps_expected_failures_apart():
    cert = load("fast-run1.json")
    page = report.render(cert, "html")
    for expected in (
        "fast 0.3.0",
        "conformant-with-expected-failures",
        "tolerance (cpu-bit-exact not declared)",
        "parameters float32: rtol 0.0001, atol 1e-05",
        "content sha256 3f1c9a0be27d",
        "torch 2.13.0+cpu",
        "13 of 13 expected tests executed",
        "Expected failures (2)",
        "Skipped for a missing capability",
        "golden md5s not compared",
        "exact checks, no numeric comparison",
    ):
        assert expected in page, expected
    assert "Did not pass" not in page  # expected failures are not failures
    # the rules line right under the verdict: an expected failure certifies no rule
    rules_line = f'<div class="rules-line">rules: {html.escape(cert["rules"]["summary"], quote=True)}</div>'
    assert rules_line in page and page.index('class="reason"') < page.index(rules_line) < page.index("<h2")
    assert "; 7 failed; 1 skipped for a missing capability; " in page
    table = page[
        page.index('<h2 id="rules">Rules by status</h2>') : page.index("<h2>Clauses named by tests</h2>")
    ]
    failed = "2.4.5; 3.1.2; 3.4.2; 3.4.4; 3.7.1; 3.7.3; 3.10.1"  # the expected failures' rules
    assert f'<tr><td>failed</td><td class="n">7</td><td>{failed}</td></tr>' in table
    assert '<tr><td>skipped for a missing capability</td><td class="n">1</td><td>2.6.1</td></tr>' in table
    assert "reference-only" in table and "1.6.10" in table
    assert 'class="k-xfailed" style="border-color:#1971c2"' in page
    failing = report.render(load("mutant-beta-rounding.json"), "html")
    assert (
        failing.index("Did not pass (4)")
        < failing.index("Margins per clause")
        < failing.index("What was certified")
    )
    assert failing.count('class="k-failed" style="border-color:#c92a2a"') == 3
    assert (
        "pytest --impl=tests.mutants:beta_rounding &#39;test_optimizer.py::test_block_step_matches_reference"
        in failing
    )


def test_html_escapes_hostile_strings():
    page = report.render(hostile_certificate(), "html", source="<b>x</b>.json")
    assert "<script>" not in page
    assert "evil|&lt;script&gt;alert(1)&lt;/script&gt;" in page and "&amp;amp;" in page
    assert "\x01" not in page and "\\x01" in page
    assert "&lt;b&gt;x&lt;/b&gt;.json" in page
    parser = TagCollector()
    parser.feed(page)
    assert set(parser.tags) <= ALLOWED_TAGS and "script" not in parser.tags


def test_chart_of_a_certificate_without_comparisons_names_every_clause():
    cert = load("reference-run1.json")
    silent = [r for r in report_model.chart_rows(cert) if r.kind in ("checked", "skipped")]
    assert margin_chart(silent).count('class="crow"') == len(silent) + 1  # the axis row too


def test_the_rerun_command_follows_the_launcher_and_device():
    cert = load("fast-run1.json")
    assert problems.rerun_command(cert, "test_x.py::t[a-b]") == "pytest --impl=fast 'test_x.py::t[a-b]'"
    cert["implementation"]["spec"] = "fast.conformance:IMPLEMENTATION"
    cert["execution"].update(device_type="cuda")
    assert (
        problems.rerun_command(cert, "test_x.py::t")
        == "pytest --impl=fast.conformance:IMPLEMENTATION --gefen-device=cuda test_x.py::t"
    )
    cert["execution"].update(launcher="torchrun", world_size=4, nodes=1, device_type="cpu")
    assert (
        problems.rerun_command(cert, "test_x.py::t")
        == "gefen-conformance certify --impl fast.conformance:IMPLEMENTATION --launcher torchrun "
        "--nproc-per-node 4 test_x.py::t"
    )


# --- the command -----------------------------------------------------------------------------------


def test_report_command_writes_html_for_an_html_path(tmp_path, capsys):
    out = tmp_path / "sub" / "report.html"
    assert cli.main(["report", str(FIXTURES / "fast-run1.json"), "--out", str(out)]) == 0
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert "wrote" in capsys.readouterr().out


def test_report_command_prints_markdown_by_default(capsys):
    assert cli.main(["report", str(FIXTURES / "reference-run1.json")]) == 0
    assert capsys.readouterr().out.startswith("# Gefen conformance: reference 0.1.0")


def test_report_command_refuses_schema_1_in_one_line_and_writes_nothing(tmp_path, capsys):
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"schema": "gefen-conformance-certificate/1", "tests": []}))
    out = tmp_path / "r.md"
    assert cli.main(["report", str(old), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        len(err.splitlines()) == 1
        and "schema gefen-conformance-certificate/1 is not supported, re-run the suite" in err
    )
    assert not out.exists() and not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize(
    "content,problem",
    [
        ("{", "not JSON"),
        ("[]", "not a certificate"),
        ('{"schema": "gefen-conformance-certificate/9"}', "unknown certificate schema"),
        (
            '{"schema": "gefen-conformance-certificate/2", "implementation": {"name": "x"}, "verdict": '
            '"conformant",'
            ' "summary": {}, "clauses": {}}',
            "'tests' must be a list",
        ),
        (
            '{"schema": "gefen-conformance-certificate/2", "implementation": {"name": "x"}, "verdict": '
            '"great",'
            ' "summary": {}, "clauses": {}, "tests": []}',
            "unknown verdict 'great'",
        ),
    ],
)
def test_report_command_names_the_problem_of_a_bad_certificate(tmp_path, capsys, content, problem):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    assert cli.main(["report", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert problem in err and str(bad) in err and len(err.splitlines()) == 1


@pytest.mark.parametrize(
    "change,problem",
    [
        (
            lambda c: c["tests"][0]["margins"].append(
                {"what": "w", "kind": "bitwise", "differing": "3", "total": 8}
            ),
            "bitwise margin 'w' needs integer 'differing' and 'total'",
        ),
        (
            lambda c: c["tests"][0]["margins"].append({"what": "w", "kind": "tolerance", "used": "0.5"}),
            "neither a number nor null",
        ),
        (
            lambda c: c["tests"][0]["margins"].append({"what": "w", "kind": "ulp"}),
            "'margins' must be a list of tolerance or bitwise",
        ),
        (lambda c: c["clauses"]["1.8"].update(passed=1.5), "clause '1.8': outcome counts must be integers"),
        (lambda c: c["clauses"]["1.8"].update(worst_margin=0.3), "clause '1.8' must map to"),
        (lambda c: c.update(notes="one note"), "'notes' must be a list"),
        (
            lambda c: c["implementation"].update(capabilities="factored-v"),
            "'implementation.capabilities' must be a list",
        ),
        (lambda c: c["tests"][0].update(outcome="crashed"), "unknown outcome 'crashed'"),
        (lambda c: c["rules"].pop("summary"), "'rules' must be an object with a string 'summary'"),
        (lambda c: c["rules"]["ids"].update(failed="3.1.2"), "'rules.ids' must map to lists of rule ids"),
    ],
)
def test_a_malformed_certificate_is_refused_naming_the_key(tmp_path, capsys, change, problem):
    cert = copy.deepcopy(load("fast-run1.json"))
    change(cert)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(cert))
    assert cli.main(["report", str(path)]) == 2
    err = capsys.readouterr().err
    assert problem in err and len(err.strip().splitlines()) == 1


def test_a_certificate_with_only_the_required_keys_still_reports_and_diffs():
    from gefen_conformance.certificate import diff as certificate_diff

    full = load("mutant-beta-rounding.json")
    bare = {k: full[k] for k in ("schema", "implementation", "verdict", "summary", "clauses")}
    bare["implementation"] = {"name": "bare"}
    bare["clauses"] = {
        c: {k: v for k, v in counts.items() if k != "worst_margin"} for c, counts in full["clauses"].items()
    }
    bare["tests"] = [
        {"id": t["id"], "outcome": t["outcome"], "clauses": t["clauses"], "margins": t["margins"]}
        for t in full["tests"]
    ]
    assert certificate_read.check(bare) == ""
    md = report.render(bare, "md")
    assert "completeness not recorded" in md
    assert (
        "| 5.3.3 | 0 | 1 | 1 | 0 | 0 | 0 | 620 % (outside its bound) |" in md
    )  # worst margins found from the tests
    assert "Did not pass (4)" in report.render(bare, "html")
    diff = certificate_diff.compare(full, bare)
    assert diff.identity and not diff.new_failures
    assert certificate_diff.render(diff, full, bare)

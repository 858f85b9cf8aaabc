"""The documentation site (properdocs.yml, docs/) builds strictly: any warning fails the build, a
broken link, a missing page or anchor, or a page left out of the navigation among them. Its command
line reference, generated from ``gefen_conformance.cli.build_parser()`` when the site is built, has
every command of the parser with its options and exit statuses; the specification and architecture
pages show SPEC.md and ARCHITECTURE.md as they are in the repository."""

from __future__ import annotations

import argparse
import html
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gefen_conformance import cli

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "properdocs.yml"


def _build(config: Path, site: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "properdocs", "build", "--strict", "-f", str(config), "-d", str(site)]
    built = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    if "No module named properdocs" in built.stderr:
        pytest.fail("ProperDocs is not installed: pip install -e '.[test]'")
    return built


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("site")
    built = _build(CONFIG, site)
    assert built.returncode == 0, built.stderr[-4000:]
    assert "WARNING" not in built.stderr, built.stderr[-4000:]
    return site


def _text(page: Path) -> str:
    """The page's text without tags, entities decoded."""
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text(encoding="utf-8")))


def _pages(nav) -> list[str]:
    out = []
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        out += _pages(value) if isinstance(value, list) else [value]
    return out


def test_every_page_of_the_navigation_is_built(site):
    pages = _pages(yaml.safe_load(CONFIG.read_text(encoding="utf-8"))["nav"])
    assert {"index.md", "kernel-authors.md", "cli.md", "spec.md", "architecture.md"} <= set(pages)
    for page in pages:
        assert (site / page.replace(".md", ".html")).is_file(), page


def _commands(parser: argparse.ArgumentParser):
    """``parser`` and every parser below it."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in {id(p): p for p in action.choices.values()}.values():
                yield from _commands(sub)


def test_the_command_reference_has_every_command_with_its_options_and_exit_statuses(site):
    page = (site / "cli.html").read_text(encoding="utf-8")
    text = _text(site / "cli.html")
    ids = set(re.findall(r'<h[2-4] id="([^"]+)"', page))
    parsers = list(_commands(cli.build_parser()))
    assert {"certify", "report", "diff", "golden", "verify", "repro", "vectors"} <= {
        p.prog.split()[-1] for p in parsers
    }
    for parser in parsers:
        assert "-".join(parser.prog.split()) in ids, f"no section for {parser.prog}"
        for action in parser._actions:
            for option in action.option_strings:
                assert option in text, f"{parser.prog}: {option} missing"
        for line in (parser.epilog or "").splitlines():
            assert line.strip() in text, f"{parser.prog}: epilog line missing: {line!r}"


def test_the_certify_section_shows_the_suite_exit_statuses(site):
    text = _text(site / "cli.html")
    section = text[text.index("gefen-conformance certify") :]
    for status in (0, 1, 2, 4, 6, 7):
        assert re.search(rf"^ +{status}  ", section, re.M), status


@pytest.mark.parametrize("page,source", [("spec.html", "SPEC.md"), ("architecture.html", "ARCHITECTURE.md")])
def test_the_specification_and_architecture_pages_show_the_files(site, page, source):
    text = _text(site / page)
    headings = re.findall(r"^#{1,4} (.+)$", (REPO / source).read_text(encoding="utf-8"), re.M)
    assert headings
    for heading in headings:
        assert heading.replace("`", "") in text, f"{source}: {heading!r} not on {page}"


def test_the_readme_links_to_pages_and_sections_that_exist(site):
    """README.md is not a page of the site: its links to docs/*.md (as a code host resolves them)
    are checked here, anchors against the built pages' heading ids."""
    links = re.findall(r"\]\(([^)\s]+)\)", (REPO / "README.md").read_text(encoding="utf-8"))
    assert any(link.startswith("docs/") for link in links)
    for link in links:
        if "://" in link:
            continue
        path, _, anchor = link.partition("#")
        assert (REPO / path).is_file(), link
        if anchor:
            assert path.startswith("docs/"), link
            built = (site / path.removeprefix("docs/").replace(".md", ".html")).read_text(encoding="utf-8")
            assert f'id="{anchor}"' in built, link


def test_a_broken_link_or_anchor_fails_the_strict_build(tmp_path):
    """The site's own configuration, on one page with a broken page link, anchor and repository
    link: the build fails and names each."""
    config = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text(
        "# Home\n\n[a](no-such-page.md) [b](#no-such-anchor) [c](../no/such/file.txt)\n", encoding="utf-8"
    )
    config.update(
        docs_dir=str(docs),
        nav=[{"Home": "index.md"}],
        hooks=[str(REPO / hook) for hook in config["hooks"]],
        watch=[str(REPO / path) for path in config.get("watch", [])],
    )
    (tmp_path / "properdocs.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    built = _build(tmp_path / "properdocs.yml", tmp_path / "site")
    assert built.returncode != 0
    for target in ("no-such-page.md", "#no-such-anchor", "../no/such/file.txt"):
        assert target in built.stderr, built.stderr[-4000:]

"""What the documentation site (properdocs.yml) generates when it is built.

* ``docs/cli.md``: the command reference, from ``gefen_conformance.cli.build_parser()`` through
  argparse's own introspection: every command's usage, description, arguments with their help,
  subcommands, and the epilog with its exit-status table, as ``--help`` prints them.
* ``docs/spec.md`` and ``docs/architecture.md`` show ``SPEC.md`` and ``ARCHITECTURE.md``, read
  from the repository root at build time (the files stay where they are; nothing is copied).
* Pages link (inline links) to repository files outside ``docs/`` as a code host resolves them
  (``../examples/ci/certify-backend.yml``); the site serves each such file under
  ``repository/`` and points the link there, a Markdown file as a page of its own. A link to
  ``SPEC.md`` or ``ARCHITECTURE.md`` goes to the page that shows it. A link to a file that does
  not exist is left alone, so the strict build fails on it.

The site documents the checkout it is built from: this checkout's packages are imported first.
"""

from __future__ import annotations

import argparse
import contextlib
import html
import os
import posixpath
import re
import sys
from pathlib import Path

from properdocs.structure.files import File, InclusionLevel

REPO = Path(__file__).resolve().parents[1]
DOCS = "docs"
#: docs page -> the repository document it shows
INCLUDED = {"spec.md": "SPEC.md", "architecture.md": "ARCHITECTURE.md"}
#: where the site serves the repository files that pages link to
SERVED = "repository"
CLI_PAGE = "cli.md"
CLI_MARKER = "<!-- GENERATED AT BUILD: command reference -->"
#: the width --help would wrap usage lines at on a 100-column terminal
WIDTH = 100
_LINK = re.compile(r"(\]\()([^)\s]+)(\))")
_FENCE = re.compile(r"^(```|~~~)")


# -- links to repository files ------------------------------------------------------------------


def _source_dir(src_uri: str) -> str:
    """The repository folder a page's relative links are written from."""
    if src_uri in INCLUDED:
        return posixpath.dirname(INCLUDED[src_uri])
    if src_uri.startswith(SERVED + "/"):
        return posixpath.dirname(src_uri[len(SERVED) + 1 :])
    return posixpath.join(DOCS, posixpath.dirname(src_uri))


def _relative(target: str) -> bool:
    """Whether a link's target is a path relative to the page (not a URL, an anchor or a root path)."""
    return "://" not in target and not target.startswith(("#", "/", "mailto:"))


def _outside_links(text: str):
    """The target of each relative inline link of ``text`` outside fenced code blocks."""
    fenced = False
    for line in text.splitlines(keepends=True):
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if fenced:
            continue
        for match in _LINK.finditer(line):
            if _relative(match.group(2)):
                yield match.group(2)


def _resolve(source_dir: str, target: str) -> tuple[str, str]:
    """``(repository path, #anchor or "")`` of a relative link written from ``source_dir``."""
    path, hash_, anchor = target.partition("#")
    return posixpath.normpath(posixpath.join(source_dir, path)), hash_ + anchor


def _site_uri(repo_path: str) -> str | None:
    """Where the site has the repository file ``repo_path``, or None when it has not."""
    if repo_path.startswith(DOCS + "/"):
        return repo_path[len(DOCS) + 1 :]
    by_source = {source: page for page, source in INCLUDED.items()}
    if repo_path in by_source:
        return by_source[repo_path]
    if repo_path.startswith("../") or not (REPO / repo_path).is_file():
        return None
    return f"{SERVED}/{repo_path}"


def _page_text(file: File) -> str:
    if file.src_uri in INCLUDED:
        return (REPO / INCLUDED[file.src_uri]).read_text(encoding="utf-8")
    return Path(file.abs_src_path).read_text(encoding="utf-8")


def on_files(files, config):
    """Serve every repository file a page links to, following the links of served pages too."""
    pending = [f for f in files if f.is_documentation_page()]
    while pending:
        page = pending.pop()
        for target in _outside_links(_page_text(page)):
            repo_path, _ = _resolve(_source_dir(page.src_uri), target)
            uri = _site_uri(repo_path)
            if uri is None or not uri.startswith(SERVED + "/") or files.get_file_from_path(uri):
                continue
            served = File.generated(
                config, uri, abs_src_path=str(REPO / repo_path), inclusion=InclusionLevel.NOT_IN_NAV
            )
            files.append(served)
            if served.is_documentation_page():
                pending.append(served)
    return files


def rewrite_links(markdown: str, src_uri: str) -> str:
    """``markdown`` of the page ``src_uri`` with each link into the repository pointed at the
    site's copy (outside fenced code blocks)."""
    source_dir, page_dir = _source_dir(src_uri), posixpath.dirname(src_uri)

    def replace(match):
        if not _relative(match.group(2)):
            return match.group(0)
        repo_path, anchor = _resolve(source_dir, match.group(2))
        uri = _site_uri(repo_path)
        if uri is None:
            return match.group(0)  # a missing target: the strict build reports the link
        return match.group(1) + posixpath.relpath(uri, page_dir or ".") + anchor + match.group(3)

    out, fenced = [], False
    for line in markdown.splitlines(keepends=True):
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
        elif not fenced and "](" in line:
            line = _LINK.sub(replace, line)
        out.append(line)
    return "".join(out)


def on_page_read_source(page, config):
    if page.file.src_uri in INCLUDED:
        return (REPO / INCLUDED[page.file.src_uri]).read_text(encoding="utf-8")
    return None


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri == CLI_PAGE:
        if CLI_MARKER not in markdown:
            raise ValueError(f"{DOCS}/{CLI_PAGE} lost its marker {CLI_MARKER!r}")
        markdown = markdown.replace(CLI_MARKER, cli_reference())
    return rewrite_links(markdown, page.file.src_uri)


# -- the command reference ------------------------------------------------------------------------


@contextlib.contextmanager
def _plain_help(width: int):
    """argparse wraps at the terminal's width and, from Python 3.14, colours help on a terminal: fix
    the width and turn colour off, so the page does not depend on where it is built."""
    fixed = {"COLUMNS": str(width), "PYTHON_COLORS": "0", "NO_COLOR": "1"}
    before = {name: os.environ.get(name) for name in fixed}
    os.environ.update(fixed)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


def _import_checkout() -> None:
    for folder in ("oracles", "reference", "conformance"):
        path = str(REPO / folder)
        if path not in sys.path:
            sys.path.insert(0, path)


def _inline(text: str) -> str:
    """Help text as Markdown: code spans kept, everything else shown literally."""
    parts = re.split(r"(`[^`]*`)", " ".join(text.split()))
    return "".join(
        part if part.startswith("`") else re.sub(r"([\\*_\[\]|])", r"\\\1", html.escape(part, quote=False))
        for part in parts
    )


def subcommands(parser: argparse.ArgumentParser):
    """``(name, parser, one-line help)`` of each subcommand of ``parser``, in the order ``--help``
    lists them."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            seen = set()
            for name, sub in action.choices.items():
                if id(sub) not in seen:  # an alias names the same parser again
                    seen.add(id(sub))
                    yield name, sub, helps.get(name)


def commands(parser: argparse.ArgumentParser, help_: str | None = None, depth: int = 0):
    """``(parser, one-line help, depth)`` of ``parser`` and every command below it, depth first."""
    yield parser, help_, depth
    for _name, sub, sub_help in subcommands(parser):
        yield from commands(sub, sub_help, depth + 1)


def anchor(prog: str) -> str:
    """The heading id of a command's section: ``gefen-conformance golden check`` ->
    ``gefen-conformance-golden-check``."""
    return "-".join(prog.split())


def _command(parser: argparse.ArgumentParser, help_: str | None, depth: int) -> list[str]:
    formatter = parser._get_formatter()
    out = [f"{'#' * min(depth + 2, 4)} {parser.prog}", ""]
    if help_:
        out += [_inline(help_[0].upper() + help_[1:]) + ".", ""]
    out += ["```text", parser.format_usage().rstrip(), "```", ""]
    if parser.description:
        out += [_inline(parser.description.replace("%(prog)s", parser.prog)), ""]
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if a.help is not argparse.SUPPRESS]
        if not actions:
            continue
        out += [f"**{_inline(group.title)}**", ""]
        if group.description:
            out += [_inline(group.description), ""]
        for action in actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub, sub_help in subcommands(parser):
                    text = f": {_inline(sub_help)}" if sub_help else ""
                    out.append(f"- [`{name}`](#{anchor(sub.prog)}){text}")
                continue
            invocation = formatter._format_action_invocation(action)
            text = formatter._expand_help(action) if action.help else ""
            out.append(f"- `{invocation}`" + (f": {_inline(text)}" if text else ""))
        out.append("")
    if parser.epilog:
        out += ["```text", parser.epilog.replace("%(prog)s", parser.prog).strip("\n"), "```", ""]
    return out


def cli_reference() -> str:
    """The Markdown of every ``gefen-conformance`` command, as its ``--help`` describes it."""
    _import_checkout()
    from gefen_conformance import cli

    with _plain_help(WIDTH):
        parser = cli.build_parser()
        lines = []
        for command, help_, depth in commands(parser):
            lines += _command(command, help_, depth)
    return "\n".join(lines)

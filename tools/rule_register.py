"""The register of SPEC.md's rules: every requirement Parts 1-3 place on an implementation, by id.

    python tools/rule_register.py            # print the register's summary
    python tools/rule_register.py --write    # regenerate the register the certificate reads

A *rule* has a stable id made of its clause and, where the clause holds several requirements, a
number: ``1.1.2#3`` is row 3 of the validation table of clause 1.1.2. SPEC.md states the ids in its
own structure, so the ids are the numbers a reader already sees (SPEC 0.2.4):

* a table whose first column is headed ``#``: each row is the rule ``<clause>#<that cell>``;
* a numbered list (``1.``, ``2.``, ...): each item is the rule ``<clause>#<its number>``;
* an explicit marker ``[#N]`` in prose or in a bullet: the rule ``<clause>#N``;
* a clause with none of these is one rule, named by the clause itself (``1.12.9``).

Informative text is not a rule: a clause or paragraph that calls itself informative, the sections
of documented differences from gefen-x (1.14, 2.7, 3.9) and worked tables whose first column is not
``#``. A clause that numbers its rules one way (a ``#`` table, a list or markers) may mix them only
where the numbers do not collide; a collision is an error.

A line ``*Not certified:* #8, #9 (reference-only: why)`` after a clause's rules marks those rules as
not certified by the suite, with one of the reasons of :data:`REASONS` (a bare clause rule is named
by ``-``). A line ``*Torch-exact only:* #1, #3 (why)`` marks rules that bind the torch-exact profile
alone (SPEC 5.6: the tolerance profile accepts what breaks them, a rounding of its own): a run under
the tolerance profile does not certify them (:data:`PROFILE_REASONS`). Every other rule is certified
by the suite tests that name it in their ``gefen_clause`` marks (tests/test_rule_register.py checks
that each is named, and killed by a rule mutant).

The register is written to ``conformance/gefen_conformance/certificate/rules.json``: the installed
suite carries no SPEC.md, and the certificate counts the rules a run certified against it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "SPEC.md"
REGISTER = REPO / "conformance" / "gefen_conformance" / "certificate" / "rules.json"
COMMAND = "python tools/rule_register.py --write"
#: The parts whose requirements bind an implementation.
PARTS = ("1", "2", "3")
#: Sections that document differences from gefen-x: informative, no rule.
INFORMATIVE_SECTIONS = ("1.14", "2.7", "3.9")
#: Why the suite does not certify a rule.
REASONS = {
    "reference-only": "binds the reference only: other implementations may differ (out of the suite's scope)",
    "out-of-scope": "outside what the suite certifies, by SPEC",
    "device": "needs a device this suite's CPU run does not have",
    "omission": "a documented omission of the input space (SPEC 4.3.12)",
}

_SECTION = re.compile(r"^### (\d+\.\d+) ")
_PART = re.compile(r"^## (?:Part (\d+)|(\d+)\.) ")
_CLAUSE = re.compile(r"^(\d+\.\d+\.\d+) (.*)")
_ITEM = re.compile(r"^(\d+)\. (.*)")
_MARKER = re.compile(r"\[#(\d+)\]")
#: Why a run under another numeric profile does not certify a rule that binds one profile.
PROFILE_REASONS = {
    "torch-exact-only": "binds the torch-exact profile only (SPEC 5.6): the tolerance profile accepts "
    "a kernel's own rounding here, so a run under it does not certify the rule",
}
_TORCH_EXACT_ONLY = re.compile(r"^\*Torch-exact only:\* (?P<ids>[-#\d, ]+) \((?P<why>.+)\)\s*$")
_NOT_CERTIFIED = re.compile(r"^\*Not certified:\* (?P<ids>[-#\d, ]+) \((?P<reason>[\w-]+): (?P<why>.+)\)\s*$")
_INFORMATIVE = re.compile(r"^\s*(?:\*\*[^*]*\*\*\s*)?\(?informative\b", re.I)


class RegisterError(ValueError):
    """SPEC.md's rule structure is inconsistent: a duplicate id, an unknown reason, a stray mark."""


@dataclass
class Rule:
    id: str
    clause: str
    line: int
    text: str
    not_certified: str | None = None  # a key of REASONS
    why: str | None = None
    profile: str | None = None  # "torch-exact": the only profile that certifies the rule
    profile_why: str | None = None


def _brief(text: str, width: int = 140) -> str:
    text = re.sub(r"\s+", " ", _MARKER.sub("", text)).strip()
    return text if len(text) <= width else text[: width - 1].rstrip() + "…"


def _is_separator(line: str) -> bool:
    return set(line.replace("|", "").strip()) <= set("-: ")


def parse(text: str) -> list[Rule]:
    """Every rule of Parts 1-3 of the SPEC ``text``, in document order."""
    rules: dict[str, Rule] = {}
    order: list[str] = []
    part = section = clause = None
    clause_text: list[str] = []
    clause_line = 0
    numbered: set[str] = set()  # clauses that number their rules
    table_header: list[str] | None = None
    informative = False  # inside a paragraph that calls itself informative

    def add(rule_id: str, line: int, body: str) -> None:
        if rule_id in rules:
            raise RegisterError(f"SPEC.md:{line}: rule {rule_id} is defined twice")
        rules[rule_id] = Rule(rule_id, clause, line, _brief(body))
        order.append(rule_id)

    def close_clause() -> None:
        if clause and clause not in numbered and any(t.strip() for t in clause_text):
            add(clause, clause_line, " ".join(clause_text))

    def marked_rules(ids: str, mark: str, number: int) -> list:
        """The rules of the open clause a mark line names (``#2, #3``, or ``-`` for a bare clause
        rule, added here since the clause has not closed yet)."""
        out = []
        for rule_id in (i.strip() for i in ids.split(",")):
            full = clause if rule_id == "-" else f"{clause}{rule_id}"
            if rule_id != "-" and full not in rules:
                raise RegisterError(f"SPEC.md:{number}: {full} is marked {mark} but is no rule")
            if full not in rules:
                numbered.discard(clause)
                close_clause()
                numbered.add(clause)
            out.append(rules[full])
        return out

    lines = text.splitlines()
    for number, line in enumerate(lines, 1):
        heading = _PART.match(line)
        if heading:
            close_clause()
            part, section, clause, clause_text = heading.group(1) or heading.group(2), None, None, []
            continue
        if part not in PARTS:
            continue
        heading = _SECTION.match(line)
        if heading:
            close_clause()
            section, clause, clause_text, table_header = heading.group(1), None, [], None
            continue
        if section is None or section in INFORMATIVE_SECTIONS:
            continue
        opened = _CLAUSE.match(line)
        if opened and opened.group(1).startswith(section + "."):
            close_clause()
            clause, clause_line, clause_text, table_header = opened.group(1), number, [], None
            line, informative = opened.group(2), False
        elif clause is None:
            continue
        if not line.strip():
            informative = False
        elif informative or _INFORMATIVE.match(line):
            # the informative paragraph runs to the next blank line
            informative = True
            continue
        bound = _TORCH_EXACT_ONLY.match(line)
        if bound:
            for pending in marked_rules(bound.group("ids"), "torch-exact only", number):
                pending.profile, pending.profile_why = "torch-exact", bound.group("why")
            continue
        marked = _NOT_CERTIFIED.match(line)
        if marked:
            if marked.group("reason") not in REASONS:
                raise RegisterError(f"SPEC.md:{number}: unknown reason {marked.group('reason')!r}")
            for pending in marked_rules(marked.group("ids"), "not certified", number):
                pending.not_certified, pending.why = marked.group("reason"), marked.group("why")
            continue
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if table_header is None:
                table_header = cells
            elif not _is_separator(line) and table_header[0] == "#":
                numbered.add(clause)
                add(f"{clause}#{cells[0]}", number, " | ".join(cells[1:]))
            continue
        table_header = None
        item = _ITEM.match(line)
        if item:
            numbered.add(clause)
            add(f"{clause}#{item.group(1)}", number, item.group(2))
            continue
        for marker in _MARKER.finditer(line):
            numbered.add(clause)
            add(f"{clause}#{marker.group(1)}", number, line[marker.end() :])
        clause_text.append(line)
    close_clause()
    return [rules[i] for i in order]


def register(spec: Path = SPEC) -> dict:
    """The register as the certificate reads it."""
    rules = parse(spec.read_text(encoding="utf-8"))
    return {
        "schema": "gefen-conformance-rules/1",
        "reasons": {**REASONS, **PROFILE_REASONS},
        # the SPEC's line numbers stay out: the register changes only where a rule does
        "rules": [{k: v for k, v in asdict(r).items() if v is not None and k != "line"} for r in rules],
    }


def rendered(spec: Path = SPEC) -> str:
    return json.dumps(register(spec), indent=1, ensure_ascii=False) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"write {REGISTER.relative_to(REPO)}")
    args = parser.parse_args(argv)
    text = rendered()
    if args.write:
        REGISTER.write_text(text, encoding="utf-8")
    rules = json.loads(text)["rules"]
    not_certified = [r for r in rules if r.get("not_certified")]
    print(f"{len(rules)} rules in Parts {', '.join(PARTS)}; {len(not_certified)} marked not certified")
    if not args.write and (not REGISTER.exists() or REGISTER.read_text(encoding="utf-8") != text):
        print(f"{REGISTER.relative_to(REPO)} is not current: run {COMMAND}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Every "rule N" the package's code cites is a rule of ``docs/guarantees.md``.

A reference names rules that exist, and the words around it are closer to
one of them than to most rules: ranking the 48 rules by the words they share
with the code around the reference (rare words weigh more), a cited rule is
among the first :data:`TOP`. A cheap check that a number is not stale: a
docstring about archives citing the rule about signals fails; a wrong number
passes by chance about one time in six.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dp_ckpt_plugin"
GUARANTEES = ROOT / "docs" / "guarantees.md"

#: ``rule 8``, ``rules 11-13``, ``rules 6, 20``, ``rule 30 and 40``, across lines.
REFERENCE = re.compile(
    r"\b[Rr]ules?\s+(\d+(?:\s*(?:,|-|\u2013|and|or)\s*\d+)*)", flags=re.MULTILINE
)
#: Words too common in both the code and the rules to tell anything.
COMMON_WORDS = (
    "about above after again along also another before being between checkpoint "
    "checkpoints could every first given guarantees other rules their there these "
    "those which while whose without would store stores under until where"
)
COMMON = frozenset(COMMON_WORDS.split())
#: How many characters either side of a reference count as its context.
CONTEXT = 150
#: How high a cited rule must rank among all rules by the words it shares.
TOP = 8


def rules() -> dict[int, str]:
    """The text of each numbered rule of the guarantees, by number."""
    text = GUARANTEES.read_text("utf-8")
    pattern = r"^(\d+)\. (.*?)(?=^\d+\. |^#|\Z)"
    found = re.finditer(pattern, text, flags=re.MULTILINE | re.DOTALL)
    return {int(item.group(1)): item.group(2) for item in found}


def numbers(group: str) -> list[int]:
    """The rule numbers a reference names (``11-13`` is 11, 12 and 13)."""
    out: list[int] = []
    for part in re.split(r"\s*(?:,|and|or)\s*", group):
        bounds = [int(n) for n in re.split(r"\s*[-\u2013]\s*", part)]
        out += list(range(bounds[0], bounds[-1] + 1))
    return out


def words(text: str) -> set[str]:
    """The words of five letters or more, cut to their first six (a cheap stem)."""
    found = {w.lower() for w in re.findall(r"[A-Za-z_]{5,}", text)}
    return {w[:6] for w in found - COMMON}


def ranking(context: str) -> list[int]:
    """The rules, those sharing the most (and rarest) words with ``context`` first."""
    known = {n: words(text) for n, text in rules().items()}
    counts: dict[str, int] = {}
    for found in known.values():
        for word in found:
            counts[word] = counts.get(word, 0) + 1
    near = words(context)

    def score(number: int) -> float:
        shared = near & known[number]
        return sum(math.log(len(known) / counts[w]) for w in shared)

    return sorted(known, key=lambda n: (-score(n), n))


def references() -> list[tuple[str, tuple[int, ...], str]]:
    """``(where, rule numbers, context)`` of every reference in the package."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text("utf-8")
        for found in REFERENCE.finditer(text):
            line = text.count("\n", 0, found.start()) + 1
            where = f"{path.relative_to(ROOT)}:{line}"
            context = text[max(0, found.start() - CONTEXT) : found.end() + CONTEXT]
            out.append((where, tuple(numbers(found.group(1))), context))
    return out


def test_the_package_cites_rules():
    assert len(references()) >= 20


def test_the_parser_reads_every_form_of_reference():
    text = "rule 8, rules 11-13, rules 6, 20 and\n rule 30 or 40, Rule 2"
    found = [numbers(m.group(1)) for m in REFERENCE.finditer(text)]
    assert found == [[8], [11, 12, 13], [6, 20], [30, 40], [2]]


def test_a_stale_number_is_caught():
    """The archive module's words point at rule 14, not at the signals' rule 29."""
    context = "Archiving the checkpoints of an earlier run instead of deleting them"
    assert ranking(context).index(14) < TOP
    assert ranking(context).index(29) >= TOP


@pytest.mark.parametrize(
    ("where", "cited", "context"), references(), ids=lambda v: str(v)[:60]
)
def test_every_cited_rule_exists_and_matches_the_code_around_it(where, cited, context):
    known = rules()
    missing = [n for n in cited if n not in known]
    assert not missing, f"{where} cites rule {missing}; the rules are 1-{max(known)}"
    order = ranking(context)
    best = min(order.index(n) for n in cited)
    assert best < TOP, (
        f"{where} cites rule {cited}, but the words around it are closer to "
        f"rules {order[:TOP]}"
    )

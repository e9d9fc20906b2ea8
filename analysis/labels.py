"""The names a report shows for its variants: `short_labels` keeps the part of each name that differs from the others,
`labels_for` applies the user's choice (`--label short|full|REGEX`), `labels_line` is the one line that gives the full
names beside the short ones. Real run names are long (`Qwen2.5-0.5B-Instruct-GSM8K-CRPO-sp-p1-b8-gamma2.0-lam0.1-
01161659`): shown whole, they turn the finding's sentences into walls of names and squeeze the plots' panels.

A name is cut into words at `-`, `_`, `/`, `,`, `:`, `|` and spaces (not at `.` or `=`: `Qwen2.5`, `lam0.1` and
`loss=dapo` stay words). Dropped, each only where every label stays distinct and none is left empty: the words all
names begin with and end with; then the words every name holds somewhere; then words that are run stamps (six or
more digits, as a date and time `01161659`). Names no longer than SHORT_ENOUGH are shown whole.
"""

from __future__ import annotations

import re

SHORT_ENOUGH = 24  # characters: where every name is at most this long, the names are shown as they are
FULL, SHORT = "full", "short"
WORDS = re.compile(r"([-_/,:| ]+)")  # the separators between the words of a name (kept with the word after them)
STAMP = re.compile(r"^(\d{6,}|\d{8}T\d{4,6})$")  # a run's date-time stamp, not a setting


class LabelError(ValueError):
    """A --label that does not give every variant its own label: one line, naming the clash."""


def _words(name: str) -> list[tuple[str, str]]:
    """(separator before, word) pairs, the first separator "" (empty words dropped)."""
    parts = WORDS.split(name)
    return [(sep, word) for sep, word in zip(["", *parts[1::2]], parts[0::2]) if word]


def _joined(pairs: list[tuple[str, str]]) -> str:
    return "".join(sep + word for sep, word in pairs).strip("-_/,:| ")


def _distinct(labels: list[str]) -> bool:
    return all(labels) and len(set(labels)) == len(labels)


def short_labels(names: list[str]) -> dict[str, str]:
    """Each name -> the part of it that differs from the others (the module's rules); names unchanged where all are
    short, or where there is only one."""
    unique = list(dict.fromkeys(names))
    if len(unique) < 2 or max(len(n) for n in unique) <= SHORT_ENOUGH:
        return {n: n for n in unique}
    kept = [_words(n) for n in unique]

    def attempt(candidate: list[list[tuple[str, str]]]) -> None:
        nonlocal kept
        if _distinct([_joined(p) for p in candidate]):
            kept = candidate

    words = [[w for _, w in p] for p in kept]
    lead = 0
    while all(len(w) > lead for w in words) and len({w[lead] for w in words}) == 1:
        lead += 1
    trail = 0
    while all(len(w) > lead + trail for w in words) and len({w[-1 - trail] for w in words}) == 1:
        trail += 1
    # the most words off that leaves each label its own; of as many, the most off the end (a name's end is its stamp
    # or a suffix more often than its settings)
    for cut in sorted({(a, b) for a in range(lead + 1) for b in range(trail + 1)}, key=lambda ab: (-sum(ab), -ab[1])):
        if _distinct([_joined(p[cut[0]:len(p) - cut[1]]) for p in kept]):
            kept = [p[cut[0]:len(p) - cut[1]] for p in kept]
            break
    everywhere = set.intersection(*({w for _, w in p} for p in kept))
    attempt([[pw for pw in p if pw[1] not in everywhere] for p in kept])
    attempt([[pw for pw in p if not STAMP.match(pw[1])] for p in kept])
    return dict(zip(unique, (_joined(p) for p in kept)))


def labels_for(names: list[str], how: str | None = None) -> dict[str, str]:
    """The labels `how` asks for: `short` (default: short_labels), `full` (the names whole), or a regular
    expression whose first group (else its whole match) is each label; a LabelError where two variants would share
    a label or a name does not match."""
    unique = list(dict.fromkeys(names))
    if how in (None, SHORT):
        return short_labels(unique)
    if how == FULL:
        return {n: n for n in unique}
    try:
        pattern = re.compile(how)
    except re.error as err:
        raise LabelError(f"--label {how}: not full, short or a regular expression ({err})") from None
    out = {}
    for name in unique:
        part = pattern_part(pattern, name)
        if part is None:
            raise LabelError(f"--label {how}: variant {name} does not match")
        out[name] = part or name
    clash = next((label for label in out.values() if list(out.values()).count(label) > 1), None)
    if clash is not None:
        both = [n for n, label in out.items() if label == clash]
        raise LabelError(f"--label {how}: {both[0]} and {both[1]} would both be shown as {clash}")
    return out


def pattern_part(pattern: re.Pattern, text: str) -> str | None:
    """The part of `text` a pattern picks (--label's, --variant name:'s): its first group where it has groups, else
    its whole match ("" where the group took no part); None where it does not match."""
    found = pattern.search(text)
    if found is None:
        return None
    return (found.group(1) or "") if pattern.groups else found.group(0)


def labels_line(labels: dict[str, str]) -> str | None:
    """The one line that says which full name each label stands for (None where every name is shown whole)."""
    changed = {name: label for name, label in labels.items() if name != label}
    if not changed:
        return None
    return ("names: each variant is shown by the part of its name that differs (--label full shows them whole): "
            + "; ".join(f"{label} = {name}" for name, label in labels.items()))

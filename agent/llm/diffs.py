"""SEARCH/REPLACE edit blocks (the format Aider and OpenEvolve use): finding them in a reply and applying them.

    <<<<<<< SEARCH
    lines copied exactly from the kernel shown
    =======
    the lines that replace them
    >>>>>>> REPLACE

A reply may hold several blocks, inside or outside code fences; they apply in order to the kernel the request showed
(the parent of a fix or an improvement, kernel A of a crossover). Each SEARCH text must occur exactly once: first
as written, then ignoring trailing whitespace, then ignoring indentation where the block's lines keep their relative
indentation. An edit that does not apply is an `EditError` whose message says which block and why, in one sentence
the next request shows the model.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

_START = re.compile(r"^[ \t]*<{5,9}[ \t]*SEARCH[ \t]*$")
_MIDDLE = re.compile(r"^[ \t]*={5,9}[ \t]*$")
_END = re.compile(r"^[ \t]*>{5,9}[ \t]*REPLACE[ \t]*$")


@dataclass(frozen=True)
class Edit:
    search: str
    replace: str


class EditError(Exception):
    """An edit that does not apply; the message is one sentence for the model."""


def has_edits(reply: str) -> bool:
    return any(_START.match(line) for line in (reply or "").replace("\r\n", "\n").split("\n"))


def parse_edits(reply: str) -> list[Edit]:
    """The reply's SEARCH/REPLACE blocks in order; EditError for a block that is not closed."""
    lines = (reply or "").replace("\r\n", "\n").replace("\r", "\n").split("\n")
    edits: list[Edit] = []
    i = 0
    while i < len(lines):
        if not _START.match(lines[i]):
            i += 1
            continue
        n = len(edits) + 1
        j = i + 1
        while j < len(lines) and not _MIDDLE.match(lines[j]):
            if _START.match(lines[j]) or _END.match(lines[j]):
                raise EditError(f"edit block {n} has no '=======' line between its SEARCH and REPLACE parts")
            j += 1
        k = j + 1
        while k < len(lines) and not _END.match(lines[k]):
            if _START.match(lines[k]):
                break
            k += 1
        if j >= len(lines) or k >= len(lines) or not _END.match(lines[k]):
            raise EditError(f"edit block {n} is not closed with '>>>>>>> REPLACE' (was the reply cut off?)")
        edits.append(Edit("\n".join(lines[i + 1:j]), "\n".join(lines[j + 1:k])))
        i = k + 1
    return edits


def apply_edits(source: str, edits: list[Edit]) -> str:
    """`source` with every edit applied in order; EditError naming the first edit that does not apply."""
    text = source
    for n, edit in enumerate(edits, 1):
        text = _apply_one(text, edit, n)
    return text if text.endswith("\n") else text + "\n"


def _apply_one(text: str, edit: Edit, n: int) -> str:
    search = edit.search.strip("\n")
    if not search.strip():
        raise EditError(f"edit block {n} has an empty SEARCH part; copy the lines to replace from the kernel shown")
    count = text.count(search)
    if count == 1:
        return text.replace(search, edit.replace.strip("\n"), 1)
    if count > 1:
        raise EditError(f"edit block {n}'s SEARCH part occurs {count} times in the kernel; include more lines "
                        "around it so that it matches one place")
    lines = text.split("\n")
    want = search.split("\n")
    for loose in (_rstrip, _dedent_key):
        key = loose(want)
        hits = [i for i in range(len(lines) - len(want) + 1) if loose(lines[i:i + len(want)]) == key]
        if len(hits) == 1:
            i = hits[0]
            new = edit.replace.strip("\n").split("\n")
            if loose is _dedent_key:
                new = _reindent(new, _indent(want), _indent(lines[i:i + len(want)]))
            return "\n".join(lines[:i] + new + lines[i + len(want):])
        if len(hits) > 1:
            raise EditError(f"edit block {n}'s SEARCH part occurs {len(hits)} times in the kernel; include more "
                            "lines around it so that it matches one place")
    first = next(s for s in want if s.strip())
    close = difflib.get_close_matches(first.strip(), [s.strip() for s in lines], n=1, cutoff=0.6)
    hint = f"; the closest line is `{close[0]}`" if close else ""
    raise EditError(f"edit block {n}'s SEARCH part does not occur in the kernel it edits (its first line "
                    f"`{first.strip()[:120]}` is not there{hint}); copy the lines exactly from the kernel shown")


def _rstrip(lines: list[str]) -> list[str]:
    return [s.rstrip() for s in lines]


def _indent(lines: list[str]) -> int:
    return min((len(s) - len(s.lstrip()) for s in lines if s.strip()), default=0)


def _dedent_key(lines: list[str]) -> list[str]:
    d = _indent(lines)
    return [s[d:].rstrip() if s.strip() else "" for s in lines]


def _reindent(lines: list[str], had: int, has: int) -> list[str]:
    if has == had:
        return lines
    if has > had:
        return [" " * (has - had) + s if s.strip() else s for s in lines]
    cut = had - has
    return [s[min(cut, len(s) - len(s.lstrip())):] for s in lines]


def summary(edits: list[Edit]) -> str:
    """One line: how many lines each edit took out and put in."""
    def count(text: str) -> int:
        return len(text.strip("\n").split("\n")) if text.strip() else 0

    parts = ", ".join(f"-{count(e.search)}/+{count(e.replace)}" for e in edits)
    return f"{len(edits)} edit{'s' if len(edits) != 1 else ''} ({parts} lines)"

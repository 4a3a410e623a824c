"""A whole archive as JSON Lines, so a team can merge the runs of several machines into one archive.

One object per line, each with a "kind": `run`, `candidate` (with its source inline and its parents named by uid,
since local ids differ between machines), `reverification` (its candidate named by uid), `duel` (challenger and
incumbent named by uid) or `batch` (one `crucible batch` over a folder with its tasks' summary rows, from which
`crucible archive report` rebuilds the KernelBench table). Lines are written parents first, and a re-check, a duel
or a batch after what it names. Importing skips what is already there: runs and batches by id, candidates, re-checks
and duels by uid, so importing the same file twice, or files that overlap, adds each record once. A duel whose challenger or incumbent is in neither the file
nor the archive is skipped and counted: without both kernels it says nothing.

The header's format names the kinds a file may hold: crucible-archive/1 runs, candidates and re-checks; /2 adds
duels; /3 batches (a whole archive's export only: a task's filtered export leaves them out). A reader reads every format up to its own and refuses a newer one at the header, before it adds anything, so
an older crucible stops with one sentence instead of half-way through, at the first line of a kind it does not know.
"""
from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from agent.archive.records import Batch, Candidate, Duel, DuelLeg, Reverification, Run, Timings

from agent.archive.store import Archive

log = logging.getLogger(__name__)
FORMAT = "crucible-archive/3"
READS = ("crucible-archive/1", "crucible-archive/2", FORMAT)  # every format up to this one: a file of an older crucible still imports
KINDS = ("run", "candidate", "reverification", "duel", "batch")


class TransferError(ValueError):
    """A file that is not an archive export; the message names the line."""


def dump(archive: Archive, out: IO[str], *, task: str | None = None) -> dict[str, int]:
    """Writes the archive (or one task's part of it) to `out`; returns how many records of each kind."""
    counts = dict.fromkeys(KINDS, 0)
    cands = archive.candidates(task=task)
    uids = {c.id: c.uid for c in cands}
    # A task's duels are those its candidates fought as challenger. The incumbent shares the challenger's task hash,
    # but not always its path (a task file moved between runs): one the filter left out is named like a parent.
    duels = [d for d in archive.duels() if d.challenger_id in uids]
    linked = {p for c in cands for p in (c.parent_id, c.parent2_id) if p} | {d.incumbent_id for d in duels}
    missing = linked - uids.keys()
    for pid in missing:  # outside the filter (another task's kernel): named, so lineage survives a merge
        parent = archive.get(pid, with_source=False)
        if parent is not None:
            uids[pid] = parent.uid
    out.write(json.dumps({"kind": "header", "format": FORMAT, "source": str(archive.path)}) + "\n")
    run_ids = {c.run_id for c in cands} | {d.run_id for d in duels}
    for run in archive.runs():
        if task is None or run.id in run_ids:
            out.write(json.dumps({"kind": "run", **dataclasses.asdict(run)}) + "\n")
            counts["run"] += 1
    for c in cands:
        record = archive.with_source(c).to_dict()
        record.pop("id")
        record["parent_uid"] = uids.get(c.parent_id) if c.parent_id else None
        record["parent2_uid"] = uids.get(c.parent2_id) if c.parent2_id else None
        record.pop("parent_id"), record.pop("parent2_id")
        out.write(json.dumps({"kind": "candidate", **record}) + "\n")
        counts["candidate"] += 1
    for rev in archive.reverifications():
        if rev.candidate_id in uids and rev.candidate_id not in missing:
            record = rev.to_dict()
            record.pop("id")
            record["candidate_uid"] = uids[record.pop("candidate_id")]
            out.write(json.dumps({"kind": "reverification", **record}) + "\n")
            counts["reverification"] += 1
    for d in duels:
        record = d.to_dict()
        record.pop("id")
        record["challenger_uid"] = uids[record.pop("challenger_id")]
        record["incumbent_uid"] = uids[record.pop("incumbent_id")]
        out.write(json.dumps({"kind": "duel", **record}) + "\n")
        counts["duel"] += 1
    for batch in archive.batches() if task is None else []:
        rows = archive.batch_rows(batch.id)
        out.write(json.dumps({"kind": "batch", **dataclasses.asdict(batch), "rows": rows}, default=str) + "\n")
        counts["batch"] += 1
    return counts


@dataclass
class Merged:
    """What an import added, what it skipped as already present, and what it could not link."""

    added: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    skipped: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    orphans: int = 0  # candidates whose parent is in neither archive: kept, without that link
    unmatched_duels: int = 0  # duels whose challenger or incumbent is in neither: not added


def load(archive: Archive, lines: Iterable[str], *, name: str = "input") -> Merged:
    """Merges exported records into `archive`. Each record is one transaction; a bad line stops the import."""
    merged = Merged()
    for lineno, record in _records(lines, name):
        kind = record.pop("kind")
        try:
            if kind == "header":
                if record.get("format") not in READS:
                    raise TransferError(f"{name} is in format {record.get('format')!r}, which this crucible does not "
                                        f"read (it reads {' and '.join(READS)}); import it with a newer crucible")
                continue
            if kind == "run":
                added = archive.add_run_if_new(Run(**record))
            elif kind == "candidate":
                added = _add_candidate(archive, record, merged)
            elif kind == "reverification":
                added = _add_reverification(archive, record)
            elif kind == "duel":
                added = _add_duel(archive, record, merged)
                if added is None:
                    continue
            elif kind == "batch":
                added = _add_batch(archive, record)
            else:
                raise TransferError(f"{name} line {lineno}: unknown record kind {kind!r}")
        except (TypeError, KeyError, ValueError) as exc:
            if isinstance(exc, TransferError):
                raise
            raise TransferError(f"{name} line {lineno}: not a {kind} record this crucible can read ({exc})") from None
        (merged.added if added else merged.skipped)[kind] += 1
    return merged


def _records(lines: Iterable[str], name: str) -> Iterator[tuple[int, dict[str, Any]]]:
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TransferError(f"{name} line {lineno} is not JSON ({exc.msg}); is this a file from "
                                "`crucible archive export -o FILE.jsonl`?") from None
        if not isinstance(record, dict) or "kind" not in record:
            raise TransferError(f"{name} line {lineno} has no record kind; is this a file from "
                                "`crucible archive export -o FILE.jsonl`?")
        yield lineno, record


def _local_id(archive: Archive, uid: str | None) -> int | None:
    if not uid:
        return None
    found = archive.by_uid(uid)
    return found[0].id if found and found[0].uid == uid else None


def _add_candidate(archive: Archive, record: dict[str, Any], merged: Merged) -> bool:
    uid = record.get("uid")
    if not uid:
        raise ValueError("a candidate without a uid")
    if _local_id(archive, uid) is not None:
        return False
    if record.get("run_id") and archive.get_run(record["run_id"]) is None:
        record["run_id"] = None  # its run was not exported with it (a filtered export)
    parents = []
    for key in ("parent_uid", "parent2_uid"):
        parent_uid = record.pop(key, None)
        pid = _local_id(archive, parent_uid)
        if parent_uid and pid is None:
            merged.orphans += 1
            log.warning("candidate %s: parent %s is in neither archive; kept without that link", uid, parent_uid)
        parents.append(pid)
    timings = Timings(**record.pop("timings"))
    cand = Candidate(timings=timings, parent_id=parents[0], parent2_id=parents[1], **record)
    archive.add(cand)
    return True


def _add_reverification(archive: Archive, record: dict[str, Any]) -> bool:
    if archive.has_reverification(record["uid"]):
        return False
    cand_id = _local_id(archive, record.pop("candidate_uid"))
    if cand_id is None:
        raise ValueError("a re-check of a candidate that is not in the file or the archive")
    archive.add_reverification(Reverification(candidate_id=cand_id, timings=Timings(**record.pop("timings")),
                                              **record))
    return True


def _add_duel(archive: Archive, record: dict[str, Any], merged: Merged) -> bool | None:
    """False when already here, None when a side is in neither the file nor the archive (counted, not added)."""
    if not record.get("uid"):
        raise ValueError("a duel without a uid")
    if archive.has_duel(record["uid"]):
        return False
    sides = {key: _local_id(archive, record.pop(f"{key}_uid")) for key in ("challenger", "incumbent")}
    if None in sides.values():
        merged.unmatched_duels += 1
        log.warning("duel %s: its %s is in neither the file nor the archive; skipped", record["uid"],
                    " and ".join(k for k, v in sides.items() if v is None))
        return None
    if record.get("run_id") and archive.get_run(record["run_id"]) is None:
        record["run_id"] = None
    legs = tuple(DuelLeg(**leg) for leg in record.pop("legs"))
    archive.add_duel(Duel(challenger_id=sides["challenger"], incumbent_id=sides["incumbent"], legs=legs, **record))
    return True


def _add_batch(archive: Archive, record: dict[str, Any]) -> bool:
    rows = record.pop("rows")
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "task" in r and "status" in r for r in rows):
        raise ValueError("a batch whose rows are not task summary rows")
    if archive.get_batch(record["id"]) is not None:
        return False
    archive.add_batch(Batch(**record))
    for position, row in enumerate(rows):
        archive.set_batch_row(record["id"], position, row)
    return True


def dump_file(archive: Archive, path: Path, *, task: str | None = None) -> dict[str, int]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        return dump(archive, out, task=task)


def load_file(archive: Archive, path: Path) -> Merged:
    with path.open(encoding="utf-8") as lines:
        return load(archive, lines, name=str(path))

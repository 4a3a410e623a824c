"""Batch throughput on one GPU against several, from the archives and `--json-out` summaries of two
`crucible batch` runs over the same task folder: verified candidates per minute per GPU, the scaling factor, and
whether any candidate was evaluated twice (the same source twice in one run) or lost (a proposal with no
evaluated candidate in the archive).

    python3 benchmarks/batch_scaling.py ONE.db ONE.json MANY.db MANY.json --gpus N [--out FILE]

Wall time is the batch's span in the archive: the last `finished` minus the first `started` over the batch's runs
(runs of different tasks overlap when `crucible batch --gpus N` runs one task per GPU, so their durations are not
summed; a run with no `finished`, a killed one, counts only through its start). Exit 1 when a candidate was
evaluated twice or lost.
"""
from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from dataclasses import asdict, dataclass
from datetime import datetime


@dataclass(frozen=True)
class Batch:
    gpus: int
    tasks: int
    wall_s: float
    evaluated: int
    verified: int
    duplicates: int  # (run, source) pairs evaluated more than once
    lost: int  # proposals (plus the starting kernel) with no evaluated candidate

    @property
    def verified_per_min_per_gpu(self) -> float:
        return self.verified / (self.wall_s / 60) / self.gpus if self.wall_s > 0 else 0.0


def read(archive: str, summary: str, gpus: int) -> Batch:
    rows = json.load(open(summary))
    runs = [r["run_id"] for r in rows if r.get("run_id")]
    db = sqlite3.connect(archive)
    evaluated = verified = duplicates = lost = 0
    starts, ends = [], []
    for row in rows:
        run = row.get("run_id")
        if not run:
            continue
        started, finished = db.execute("SELECT started, finished FROM runs WHERE id = ?", (run,)).fetchone()
        starts.append(datetime.fromisoformat(started))
        if finished:
            ends.append(datetime.fromisoformat(finished))
        done = db.execute("SELECT COUNT(*), SUM(verdict = 'accepted') FROM candidates WHERE run_id = ? AND verdict "
                          "IS NOT NULL", (run,)).fetchone()
        evaluated += done[0]
        verified += done[1] or 0
        duplicates += db.execute("SELECT COUNT(*) FROM (SELECT source_sha FROM candidates WHERE run_id = ? AND "
                                 "source_sha IS NOT NULL GROUP BY source_sha HAVING COUNT(*) > 1)", (run,)).fetchone()[0]
        seeds = db.execute("SELECT COUNT(*) FROM candidates WHERE run_id = ? AND origin = 'seed'", (run,)).fetchone()[0]
        lost += max(0, int(row.get("proposals") or 0) + seeds - done[0])
    wall = (max(ends) - min(starts)).total_seconds() if ends else 0.0
    return Batch(gpus, len(runs), wall, evaluated, verified, duplicates, lost)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("one_db")
    p.add_argument("one_json")
    p.add_argument("many_db")
    p.add_argument("many_json")
    p.add_argument("--gpus", type=int, required=True, help="evaluation workers of the second batch")
    p.add_argument("--out", help="also write the result as JSON")
    a = p.parse_args(argv)
    one, many = read(a.one_db, a.one_json, 1), read(a.many_db, a.many_json, a.gpus)
    scaling = (many.verified / many.wall_s) / (one.verified / one.wall_s) if one.verified and many.wall_s else 0.0
    print(f"{'GPUs':>4s} {'tasks':>5s} {'wall s':>8s} {'evaluated':>9s} {'verified':>8s} {'/min/GPU':>8s} "
          f"{'twice':>5s} {'lost':>4s}")
    for b in (one, many):
        print(f"{b.gpus:4d} {b.tasks:5d} {b.wall_s:8.1f} {b.evaluated:9d} {b.verified:8d} "
              f"{b.verified_per_min_per_gpu:8.2f} {b.duplicates:5d} {b.lost:4d}")
    print(f"scaling on {a.gpus} GPUs: {scaling:.2f}x the verified candidates per minute of one")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"one": asdict(one), "many": asdict(many), "scaling": scaling}, f, indent=1)
    return 1 if any(b.duplicates or b.lost for b in (one, many)) else 0


if __name__ == "__main__":
    sys.exit(main())

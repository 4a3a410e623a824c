"""The archive: every candidate ever proposed, in one SQLite file (WAL, append-only schema migrations in schema.py).

Sources are stored once, keyed by sha256; a candidate row points at its source, its parents (a second parent for
crossovers), the run and task it belongs to, and holds the harness's verdict, diagnostics, timings, the environment
they were taken on, and the tokens and cost of the request that produced it. Every write is one transaction, so a
kill at any moment leaves only whole records. Sampling parents lives in agent/search/elites.py, not here.

Each candidate has a random `uid` besides its local integer id, so that archives from several machines can be merged
without id clashes (agent/archive/transfer.py).

A timed run crowns a new best only after a duel (agent/search/duel.py): challenger and incumbent re-timed back to back on
one GPU; each duel is a row of `duels`, with its legs, so `crucible archive show` can say why a kernel is or is not
the best.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import threading
import uuid
from pathlib import Path
from typing import Any

from agent.archive import schema
from agent.archive.records import Batch, Candidate, Duel, DuelLeg, Reverification, Run, Timings, now, sha256

DEFAULT_PATH = Path("runs") / "archive.db"
ENV_VAR = "CRUCIBLE_ARCHIVE"


def default_path() -> Path:
    """--archive wins over CRUCIBLE_ARCHIVE, which wins over runs/archive.db."""
    return Path(os.environ.get(ENV_VAR) or DEFAULT_PATH)


_CANDIDATE_COLUMNS = [
    "uid", "run_id", "task_path", "task_hash", "source_sha", "parent_id", "parent2_id", "origin", "proposer", "niche",
    "prompt", "reply", "verdict", "stage", "reason", "message", "diagnostics", "timed", "candidate_ms",
    "speedup_eager", "eager_ci_low", "eager_ci_high", "speedup_compile", "compile_ci_low", "compile_ci_high",
    "pct_roofline", "env", "env_hash", "input_tokens", "output_tokens", "cost_usd", "latency_s", "eval_s", "created",
]
_TIMING_FIELDS = [f.name for f in dataclasses.fields(Timings)]


class Archive:
    """One archive file. Safe to share between threads of one process (writes are serialised by a lock)."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path is not None else default_path()
        if self.path == Path(DEFAULT_PATH):
            self.path.parent.mkdir(parents=True, exist_ok=True)
        elif not self.path.parent.is_dir():  # a path the user chose: a typo must not become a new folder
            raise FileNotFoundError(f"its folder {self.path.parent} does not exist; create it or pick another path")
        self._lock = threading.RLock()
        self._db = sqlite3.connect(str(self.path), timeout=30.0, isolation_level=None, check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._migrate()

    # ---- lifecycle ------------------------------------------------------------------------------------------
    def _migrate(self) -> None:
        with self._lock:
            self._db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, applied TEXT)")
            current = self.schema_version()
            for version, script in enumerate(schema.MIGRATIONS[current:], start=current + 1):
                # executescript commits first, so the script carries its own transaction.
                self._db.executescript(f"BEGIN IMMEDIATE;\n{script}\n"
                                       f"INSERT INTO schema_version VALUES ({version}, '{now()}');\nCOMMIT;")

    def _one(self, sql: str, params: tuple | list = ()) -> sqlite3.Row | None:
        """One row of a read. Reads take the lock too: one sqlite3 connection used by two threads at once fails
        ("bad parameter or other API misuse": two batch lanes on the H200)."""
        with self._lock:
            return self._db.execute(sql, params).fetchone()

    def _all(self, sql: str, params: tuple | list = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    def schema_version(self) -> int:
        row = self._one("SELECT MAX(version) FROM schema_version")
        return int(row[0] or 0)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> "Archive":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- runs -----------------------------------------------------------------------------------------------
    def add_run(self, run: Run) -> None:
        with self._lock:
            self._db.execute("INSERT INTO runs VALUES (?,?,?,?,?,?,?,?,?)",
                             (run.id, run.task_path, run.task_hash, run.proposer, run.device,
                              json.dumps(run.config), run.started, run.finished, run.stop_reason))

    def finish_run(self, run_id: str, stop_reason: str) -> None:
        with self._lock:
            self._db.execute("UPDATE runs SET finished=?, stop_reason=? WHERE id=?", (now(), stop_reason, run_id))

    def get_run(self, run_id: str) -> Run | None:
        row = self._one("SELECT * FROM runs WHERE id=?", (run_id,))
        return _run(row) if row else None

    def latest_run(self, task_hash: str) -> Run | None:
        row = self._one("SELECT * FROM runs WHERE task_hash=? ORDER BY started DESC, rowid DESC LIMIT 1",
                        (task_hash,))
        return _run(row) if row else None

    # ---- candidates -----------------------------------------------------------------------------------------
    def add(self, cand: Candidate) -> Candidate:
        """Write one candidate (and its source, once); returns it with id, uid and created filled in."""
        sha = cand.source_sha
        if cand.source is not None:
            sha = sha256(cand.source)
        cand = dataclasses.replace(cand, source_sha=sha, uid=cand.uid or uuid.uuid4().hex,
                                   created=cand.created or now())
        values = _row_values(cand)
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                if cand.source is not None:
                    self._db.execute("INSERT OR IGNORE INTO sources VALUES (?,?)", (sha, cand.source))
                cur = self._db.execute(
                    f"INSERT INTO candidates ({','.join(_CANDIDATE_COLUMNS)}) "
                    f"VALUES ({','.join('?' * len(_CANDIDATE_COLUMNS))})", values)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return dataclasses.replace(cand, id=int(cur.lastrowid))

    def get(self, cand_id: int, *, with_source: bool = True) -> Candidate | None:
        row = self._one("SELECT * FROM candidates WHERE id=?", (cand_id,))
        if row is None:
            return None
        cand = _candidate(row)
        return self.with_source(cand) if with_source else cand

    def with_source(self, cand: Candidate) -> Candidate:
        return dataclasses.replace(cand, source=self.source(cand.source_sha)) if cand.source_sha else cand

    def source(self, sha: str) -> str | None:
        row = self._one("SELECT text FROM sources WHERE sha256=?", (sha,))
        return row[0] if row else None

    def candidates(self, *, task: str | None = None, task_hash: str | None = None, run_id: str | None = None,
                   verdict: str | None = None, timed: bool | None = None, limit: int | None = None) -> list[Candidate]:
        """Candidates in id order, filtered; `task` matches a task path or its file name."""
        where, params = _filters(task=task, task_hash=task_hash, run_id=run_id, verdict=verdict, timed=timed)
        sql = f"SELECT * FROM candidates {where} ORDER BY id"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return [_candidate(r) for r in self._all(sql, params)]

    def elites(self, task_hash: str, *, timed: bool) -> list[Candidate]:
        """Harness-verified candidates of a task, measured the same way (timed on a GPU, or correctness only)."""
        return self.candidates(task_hash=task_hash, verdict="accepted", timed=timed)

    def known_sources(self, task_hash: str, *, timed: bool) -> set[str]:
        """Sources already evaluated for a task (interrupted ones excluded: they may be evaluated again)."""
        rows = self._all(
            "SELECT DISTINCT source_sha FROM candidates WHERE task_hash=? AND timed=? AND source_sha IS NOT NULL "
            "AND verdict != 'interrupted'", (task_hash, int(timed)))
        return {r[0] for r in rows}

    def run_usage(self, run_id: str) -> dict[str, float]:
        """What a run has spent so far: proposals (seeds excluded), tokens and cost."""
        row = self._one(
            "SELECT COALESCE(SUM(origin != 'seed'),0), COALESCE(SUM(input_tokens),0), "
            "COALESCE(SUM(output_tokens),0), COALESCE(SUM(cost_usd),0) FROM candidates WHERE run_id=?",
            (run_id,))
        return {"proposals": int(row[0]), "input_tokens": int(row[1]), "output_tokens": int(row[2]),
                "cost_usd": float(row[3])}

    # ---- browsing ----------------------------------------------------------------------------------------
    def by_uid(self, prefix: str) -> list[Candidate]:
        """Candidates whose uid starts with `prefix` (a whole uid matches one at most)."""
        rows = self._all("SELECT * FROM candidates WHERE uid LIKE ? ORDER BY id LIMIT 2",
                         (prefix.replace("%", "").replace("_", "") + "%",))
        return [_candidate(r) for r in rows]

    def children(self, cand_id: int) -> list[Candidate]:
        """Candidates built on this one, as first or second parent."""
        rows = self._all("SELECT * FROM candidates WHERE parent_id=? OR parent2_id=? ORDER BY id",
                         (cand_id, cand_id))
        return [_candidate(r) for r in rows]

    def runs(self) -> list[Run]:
        return [_run(r) for r in self._all("SELECT * FROM runs ORDER BY started, rowid")]

    def add_run_if_new(self, run: Run) -> bool:
        """For merging archives: a run id already here is kept as it is."""
        with self._lock:
            cur = self._db.execute("INSERT OR IGNORE INTO runs VALUES (?,?,?,?,?,?,?,?,?)",
                                   (run.id, run.task_path, run.task_hash, run.proposer, run.device,
                                    json.dumps(run.config), run.started, run.finished, run.stop_reason))
            return cur.rowcount > 0

    def add_reverification(self, rev: Reverification) -> Reverification:
        rev = dataclasses.replace(rev, uid=rev.uid or uuid.uuid4().hex, created=rev.created or now())
        t = rev.timings
        with self._lock:
            cur = self._db.execute(
                "INSERT INTO reverifications (uid, candidate_id, status, note, verdict, stage, reason, timed, "
                "candidate_ms, speedup_eager, eager_ci_low, eager_ci_high, pct_roofline, diagnostics, env, env_hash, "
                "created) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (rev.uid, rev.candidate_id, rev.status, rev.note, rev.verdict, rev.stage, rev.reason, int(rev.timed),
                 t.candidate_ms, t.speedup_eager, t.eager_ci_low, t.eager_ci_high, t.pct_roofline,
                 json.dumps(rev.diagnostics) if rev.diagnostics is not None else None,
                 json.dumps(rev.env) if rev.env is not None else None, rev.env_hash, rev.created))
        return dataclasses.replace(rev, id=int(cur.lastrowid))

    def reverifications(self, cand_id: int | None = None) -> list[Reverification]:
        """Re-checks in the order they were made, of one candidate or of all."""
        sql, params = "SELECT * FROM reverifications", ()
        if cand_id is not None:
            sql, params = sql + " WHERE candidate_id=?", (cand_id,)
        return [_reverification(r) for r in self._all(sql + " ORDER BY id", params)]

    def has_reverification(self, uid: str) -> bool:
        return self._one("SELECT 1 FROM reverifications WHERE uid=?", (uid,)) is not None

    def latest_status(self) -> dict[int, Reverification]:
        """Each re-checked candidate's latest re-check."""
        return {r.candidate_id: r for r in self.reverifications()}

    # ---- batches --------------------------------------------------------------------------------------------
    def add_batch(self, batch: Batch) -> None:
        with self._lock:
            self._db.execute("INSERT INTO batches VALUES (?,?,?,?,?,?)",
                             (batch.id, batch.folder, batch.device, json.dumps(batch.config), batch.started,
                              batch.finished))

    def finish_batch(self, batch_id: str) -> None:
        with self._lock:
            self._db.execute("UPDATE batches SET finished=? WHERE id=?", (now(), batch_id))

    def batches(self, *, folder: str | None = None) -> list[Batch]:
        """Batches in the order they started, of one folder or of all."""
        sql, params = "SELECT * FROM batches", ()
        if folder is not None:
            sql, params = sql + " WHERE folder=?", (folder,)
        return [_batch(r) for r in self._all(sql + " ORDER BY started, rowid", params)]

    def get_batch(self, batch_id: str) -> Batch | None:
        row = self._one("SELECT * FROM batches WHERE id=?", (batch_id,))
        return _batch(row) if row else None

    def set_batch_row(self, batch_id: str, position: int, row: dict[str, Any]) -> None:
        """A task's summary row in a batch (replacing the one it had): one transaction, so a kill keeps the last."""
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO batch_tasks VALUES (?,?,?,?,?,?,?)",
                             (batch_id, Path(str(row["task"])).name, position, str(row["status"]), row.get("run_id"),
                              json.dumps(row, default=str), now()))

    def batch_rows(self, batch_id: str) -> list[dict[str, Any]]:
        """The batch's task rows in the folder's order."""
        rows = self._all("SELECT row FROM batch_tasks WHERE batch_id=? ORDER BY position, task_name", (batch_id,))
        return [json.loads(r[0]) for r in rows]

    # ---- duels ----------------------------------------------------------------------------------------------
    def add_duel(self, duel: Duel) -> Duel:
        duel = dataclasses.replace(duel, uid=duel.uid or uuid.uuid4().hex, created=duel.created or now())
        legs = json.dumps([dataclasses.asdict(leg) for leg in duel.legs])
        with self._lock:
            cur = self._db.execute(
                "INSERT INTO duels (uid, run_id, task_hash, challenger_id, incumbent_id, outcome, note, speedup, "
                "ci_low, ci_high, n_pairs, legs, seconds, created) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (duel.uid, duel.run_id, duel.task_hash, duel.challenger_id, duel.incumbent_id, duel.outcome.value,
                 duel.note, duel.speedup, duel.ci_low, duel.ci_high, duel.n_pairs, legs, duel.seconds,
                 duel.created))
        return dataclasses.replace(duel, id=int(cur.lastrowid))

    def duels(self, *, candidate_id: int | None = None, task_hash: str | None = None,
              run_id: str | None = None) -> list[Duel]:
        """Duels in the order they were decided: of a task, a run, or those a candidate fought on either side."""
        clauses, params = [], []
        if candidate_id is not None:
            clauses.append("(challenger_id = ? OR incumbent_id = ?)")
            params += [candidate_id, candidate_id]
        for col, value in (("task_hash", task_hash), ("run_id", run_id)):
            if value is not None:
                clauses.append(f"{col} = ?")
                params.append(value)
        where = ("WHERE " + " AND ".join(clauses)) if clauses else ""
        return [_duel(r) for r in self._all(f"SELECT * FROM duels {where} ORDER BY id", params)]

    def has_duel(self, uid: str) -> bool:
        return self._one("SELECT 1 FROM duels WHERE uid=?", (uid,)) is not None

    def add_reflection(self, *, task_hash: str, task_name: str, run_id: str | None, text: str,
                       candidates: int) -> None:
        with self._lock:
            self._db.execute("INSERT INTO reflections (task_hash, task_name, run_id, text, candidates, created) "
                             "VALUES (?, ?, ?, ?, ?, ?)", (task_hash, task_name, run_id, text, candidates, now()))

    def latest_reflection(self, task_hash: str, task_name: str | None = None) -> str | None:
        """The latest reflection on this version of the task, else on any task file of that name."""
        row = self._one("SELECT text FROM reflections WHERE task_hash=? ORDER BY id DESC LIMIT 1", (task_hash,))
        if row is None and task_name:
            row = self._one("SELECT text FROM reflections WHERE task_name=? ORDER BY id DESC LIMIT 1", (task_name,))
        return row[0] if row is not None else None

    def uncrowned(self, task_hash: str) -> set[int]:
        """Challengers of a task that no duel crowned: their own check ranked them above a best they did not beat."""
        lost, won = set(), set()
        for d in self.duels(task_hash=task_hash):
            (won if d.crowned else lost).add(d.challenger_id)
        return lost - won


def _filters(**kw: Any) -> tuple[str, list[Any]]:
    clauses, params = [], []
    if kw.get("task"):
        clauses.append("(task_path = ? OR task_path LIKE ?)")
        params += [kw["task"], "%/" + Path(kw["task"]).name]
    for col in ("task_hash", "run_id", "verdict"):
        if kw.get(col) is not None:
            clauses.append(f"{col} = ?")
            params.append(kw[col])
    if kw.get("timed") is not None:
        clauses.append("timed = ?")
        params.append(int(kw["timed"]))
    return ("WHERE " + " AND ".join(clauses)) if clauses else "", params


def _row_values(c: Candidate) -> list[Any]:
    out = []
    for col in _CANDIDATE_COLUMNS:
        if col in _TIMING_FIELDS:
            out.append(getattr(c.timings, col))
        elif col in ("diagnostics", "env"):
            value = getattr(c, col)
            out.append(json.dumps(value) if value is not None else None)
        elif col == "timed":
            out.append(int(c.timed))
        else:
            out.append(getattr(c, col))
    return out


_FIELDS = {f.name for f in dataclasses.fields(Candidate)} | set(_TIMING_FIELDS)


def _candidate(row: sqlite3.Row) -> Candidate:
    # Columns a later migration added (and this version does not know) are left out, not an error.
    d = {k: v for k, v in dict(row).items() if k in _FIELDS}
    timings = Timings(**{k: d.pop(k) for k in _TIMING_FIELDS})
    for col in ("diagnostics", "env"):
        d[col] = json.loads(d[col]) if d[col] else None
    d["timed"] = bool(d["timed"])
    d["message"] = d["message"] or ""
    return Candidate(timings=timings, **d)


def _reverification(row: sqlite3.Row) -> Reverification:
    d = dict(row)
    timings = Timings(**{k: d.pop(k) for k in ("candidate_ms", "speedup_eager", "eager_ci_low", "eager_ci_high",
                                                 "pct_roofline")})
    for col in ("diagnostics", "env"):
        d[col] = json.loads(d[col]) if d[col] else None
    d["timed"] = bool(d["timed"])
    return Reverification(timings=timings, **{k: v for k, v in d.items() if k in Reverification.__dataclass_fields__})


def _duel(row: sqlite3.Row) -> Duel:
    d = {k: v for k, v in dict(row).items() if k in Duel.__dataclass_fields__}
    d["legs"] = tuple(DuelLeg(**leg) for leg in json.loads(d["legs"]))
    return Duel(**d)


def _run(row: sqlite3.Row) -> Run:
    d = {k: v for k, v in dict(row).items() if k in Run.__dataclass_fields__}
    d["config"] = json.loads(d["config"])
    return Run(**d)


def _batch(row: sqlite3.Row) -> Batch:
    d = {k: v for k, v in dict(row).items() if k in Batch.__dataclass_fields__}
    d["config"] = json.loads(d["config"])
    return Batch(**d)

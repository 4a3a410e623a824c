"""The archive: every candidate ever proposed, in one SQLite file (WAL, append-only schema migrations).

Sources are stored once, keyed by sha256; a candidate row points at its source, its parents (a second parent for
crossovers), the run and task it belongs to, and holds the harness's verdict, diagnostics, timings, the environment
they were taken on, and the tokens and cost of the request that produced it. Every write is one transaction, so a
kill at any moment leaves only whole records. Sampling parents lives in agent/search/elites.py, not here.

Each candidate has a random `uid` besides its local integer id, so that archives from several machines can be merged
without id clashes (issue 8's import/export).

A timed run crowns a new best only after a duel (agent/search/duel.py): challenger and incumbent re-timed back to back on
one GPU; each duel is a row of `duels`, with its legs, so `crucible archive show` can say why a kernel is or is not
the best.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import enum
import hashlib
import json
import os
import sqlite3
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

DEFAULT_PATH = Path("runs") / "archive.db"
ENV_VAR = "CRUCIBLE_ARCHIVE"

# Applied in order, each exactly once; never edit a shipped script, append a new one.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE sources (
        sha256 TEXT PRIMARY KEY,
        text   TEXT NOT NULL
    );
    CREATE TABLE runs (
        id          TEXT PRIMARY KEY,
        task_path   TEXT NOT NULL,
        task_hash   TEXT NOT NULL,
        proposer    TEXT NOT NULL,      -- provider spec, or "tuner"
        device      TEXT NOT NULL,
        config      TEXT NOT NULL,      -- JSON of the run's settings, for --resume
        started     TEXT NOT NULL,
        finished    TEXT,
        stop_reason TEXT
    );
    CREATE TABLE candidates (
        id            INTEGER PRIMARY KEY AUTOINCREMENT,
        uid           TEXT NOT NULL UNIQUE,
        run_id        TEXT REFERENCES runs(id),
        task_path     TEXT NOT NULL,
        task_hash     TEXT NOT NULL,
        source_sha    TEXT REFERENCES sources(sha256),  -- NULL when the proposal produced no code
        parent_id     INTEGER REFERENCES candidates(id),
        parent2_id    INTEGER REFERENCES candidates(id),
        origin        TEXT NOT NULL,    -- seed | llm | tuner
        proposer      TEXT NOT NULL,    -- model name, "tuner" or "seed"
        niche         TEXT,
        prompt        TEXT,
        reply         TEXT,
        verdict       TEXT NOT NULL,    -- accepted | rejected | interrupted
        stage         TEXT,
        reason        TEXT NOT NULL,
        message       TEXT,
        diagnostics   TEXT,             -- JSON: the harness's CheckResult
        timed         INTEGER NOT NULL DEFAULT 0,
        candidate_ms  REAL,
        speedup_eager REAL, eager_ci_low REAL, eager_ci_high REAL,
        speedup_compile REAL, compile_ci_low REAL, compile_ci_high REAL,
        pct_roofline  REAL,
        env           TEXT,             -- JSON fingerprint: torch, triton, driver, GPU
        env_hash      TEXT,
        input_tokens  INTEGER NOT NULL DEFAULT 0,
        output_tokens INTEGER NOT NULL DEFAULT 0,
        cost_usd      REAL,
        latency_s     REAL,
        eval_s        REAL,
        created       TEXT NOT NULL
    );
    CREATE INDEX candidates_task ON candidates(task_hash, verdict);
    CREATE INDEX candidates_run ON candidates(run_id);
    CREATE INDEX candidates_source ON candidates(task_hash, source_sha);
    """,
    # 2: `crucible archive reverify` re-checks archived winners in a new environment. Each re-check is a new row
    # (the candidate's own record never changes); the latest row says whether it is confirmed or stale.
    """
    CREATE TABLE reverifications (
        id            INTEGER PRIMARY KEY AUTOINCREMENT,
        uid           TEXT NOT NULL UNIQUE,
        candidate_id  INTEGER NOT NULL REFERENCES candidates(id),
        status        TEXT NOT NULL,    -- confirmed | stale
        note          TEXT NOT NULL,    -- why, in one sentence
        verdict       TEXT NOT NULL,
        stage         TEXT,
        reason        TEXT NOT NULL,
        timed         INTEGER NOT NULL DEFAULT 0,
        candidate_ms  REAL,
        speedup_eager REAL, eager_ci_low REAL, eager_ci_high REAL,
        pct_roofline  REAL,
        diagnostics   TEXT,             -- JSON: the new CheckResult
        env           TEXT,
        env_hash      TEXT,
        created       TEXT NOT NULL
    );
    CREATE INDEX reverifications_candidate ON reverifications(candidate_id, id);
    """,
    # 3: a timed run re-times a challenger and the incumbent best back to back before it crowns the challenger;
    # one row per duel (or per challenger not re-timed), its legs as JSON.
    """
    CREATE TABLE duels (
        id            INTEGER PRIMARY KEY AUTOINCREMENT,
        uid           TEXT NOT NULL UNIQUE,
        run_id        TEXT REFERENCES runs(id),
        task_hash     TEXT NOT NULL,
        challenger_id INTEGER NOT NULL REFERENCES candidates(id),
        incumbent_id  INTEGER NOT NULL REFERENCES candidates(id),
        outcome       TEXT NOT NULL,    -- DuelOutcome: crowned | no significant difference | slower | ...
        note          TEXT NOT NULL,
        speedup       REAL, ci_low REAL, ci_high REAL,  -- challenger over incumbent, paired; > 1: challenger faster
        n_pairs       INTEGER NOT NULL DEFAULT 0,
        legs          TEXT NOT NULL,    -- JSON: [DuelLeg] in the order they ran
        seconds       REAL NOT NULL DEFAULT 0,
        created       TEXT NOT NULL
    );
    CREATE INDEX duels_challenger ON duels(challenger_id);
    CREATE INDEX duels_incumbent ON duels(incumbent_id);
    CREATE INDEX duels_task ON duels(task_hash);
    """,
    # 4: what has worked for a task, summarised by a run every few verdicts (agent/search/reflect.py); the latest one is
    # shown to the model by later requests, on --resume and by later runs on the same task.
    """
    CREATE TABLE reflections (
        id            INTEGER PRIMARY KEY AUTOINCREMENT,
        task_hash     TEXT NOT NULL,
        task_name     TEXT NOT NULL,    -- the task file's name: a later version of the file finds it too
        run_id        TEXT REFERENCES runs(id),
        text          TEXT NOT NULL,
        candidates    INTEGER NOT NULL, -- the task's candidates it summarises
        created       TEXT NOT NULL
    );
    CREATE INDEX reflections_task ON reflections(task_hash, id);
    CREATE INDEX reflections_name ON reflections(task_name, id);
    """,
    # 5: `crucible batch` over a folder: one row per batch and one per task of it, written as each task ends, so
    # `crucible archive report` can rebuild a level's table (fast_p and all) and `batch --resume` can skip the done.
    """
    CREATE TABLE batches (
        id        TEXT PRIMARY KEY,
        folder    TEXT NOT NULL,      -- the task folder, resolved
        device    TEXT NOT NULL,
        config    TEXT NOT NULL,      -- JSON: model, budget, --from, reference-only
        started   TEXT NOT NULL,
        finished  TEXT
    );
    CREATE TABLE batch_tasks (
        batch_id  TEXT NOT NULL REFERENCES batches(id),
        task_name TEXT NOT NULL,      -- the task file's name, unique in its folder
        position  INTEGER NOT NULL,   -- the task's place in the folder's order
        status    TEXT NOT NULL,
        run_id    TEXT,
        row       TEXT NOT NULL,      -- JSON: the task's summary row (agent/archive/batch_summary.py)
        updated   TEXT NOT NULL,
        PRIMARY KEY (batch_id, task_name)
    );
    CREATE INDEX batches_folder ON batches(folder, started);
    """,
]


def default_path() -> Path:
    """--archive wins over CRUCIBLE_ARCHIVE, which wins over runs/archive.db."""
    return Path(os.environ.get(ENV_VAR) or DEFAULT_PATH)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Timings:
    """What the GPU timing stage measured; all None on the CPU."""

    candidate_ms: float | None = None
    speedup_eager: float | None = None
    eager_ci_low: float | None = None
    eager_ci_high: float | None = None
    speedup_compile: float | None = None
    compile_ci_low: float | None = None
    compile_ci_high: float | None = None
    pct_roofline: float | None = None

    @classmethod
    def from_check(cls, timing: dict[str, Any] | None) -> "Timings":
        if not timing:
            return cls()
        base = timing.get("baselines") or {}
        eager, comp = base.get("eager") or {}, base.get("compile") or {}
        roof = timing.get("roofline") or {}
        return cls(candidate_ms=_num(timing.get("candidate_ms")),
                   speedup_eager=_num(eager.get("speedup")), eager_ci_low=_num(eager.get("ci_low")),
                   eager_ci_high=_num(eager.get("ci_high")),
                   speedup_compile=_num(comp.get("speedup")), compile_ci_low=_num(comp.get("ci_low")),
                   compile_ci_high=_num(comp.get("ci_high")),
                   pct_roofline=_num(roof.get("pct_of_roofline")))


@dataclass(frozen=True)
class Candidate:
    """One archived candidate. `id` is 0 until it is written; `source` is filled by get()/with_source()."""

    task_path: str
    task_hash: str
    origin: str
    proposer: str
    verdict: str
    reason: str
    id: int = 0
    uid: str = ""
    run_id: str | None = None
    source_sha: str | None = None
    parent_id: int | None = None
    parent2_id: int | None = None
    niche: str | None = None
    prompt: str | None = None
    reply: str | None = None
    stage: str | None = None
    message: str = ""
    diagnostics: dict[str, Any] | None = None
    timed: bool = False
    timings: Timings = Timings()
    env: dict[str, Any] | None = None
    env_hash: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None
    latency_s: float | None = None
    eval_s: float | None = None
    created: str = ""
    source: str | None = None

    def __post_init__(self) -> None:
        if self.verdict not in ("accepted", "rejected", "interrupted"):
            raise ValueError(f"unknown verdict {self.verdict!r}")
        if self.verdict == "accepted" and (self.reason != "ok" or (self.source_sha is None and self.source is None)):
            raise ValueError("an accepted candidate carries reason ok and a source")
        if self.origin not in ("seed", "llm", "tuner"):
            raise ValueError(f"unknown origin {self.origin!r}")

    @property
    def accepted(self) -> bool:
        return self.verdict == "accepted"

    @property
    def speedup(self) -> float | None:
        return self.timings.speedup_eager if self.timed else None

    def summary(self) -> dict[str, Any]:
        """The row `crucible archive list --json` prints."""
        return {"id": self.id, "task": self.task_path, "verdict": self.verdict, "stage": self.stage,
                "reason": self.reason, "proposer": self.proposer, "speedup": self.speedup, "created": self.created}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Reverification:
    """One re-check of an archived candidate in a later environment: `status` confirmed or stale, and why."""

    candidate_id: int
    status: str
    note: str
    verdict: str
    reason: str
    stage: str | None = None
    timed: bool = False
    timings: Timings = Timings()
    diagnostics: dict[str, Any] | None = None
    env: dict[str, Any] | None = None
    env_hash: str | None = None
    id: int = 0
    uid: str = ""
    created: str = ""

    def __post_init__(self) -> None:
        if self.status not in ("confirmed", "stale"):
            raise ValueError(f"unknown reverification status {self.status!r}")
        if self.status == "confirmed" and self.verdict != "accepted":
            raise ValueError("only a candidate the harness accepts again can be confirmed")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class DuelOutcome(str, enum.Enum):
    CROWNED = "crowned"  # paired faster, its interval above 1.0: the challenger is the new best
    NO_DIFFERENCE = "no significant difference"
    SLOWER = "slower"
    WITHIN_NOISE = "not re-timed"  # its lower bound did not clear the incumbent's point estimate: no duel
    FAILED = "failed"  # a leg was rejected, untimed or broke the harness
    INTERRUPTED = "interrupted"  # the run stopped first


@dataclass(frozen=True)
class DuelLeg:
    """One check of a duel. `rounds`: per timed round, the kernel's ms over eager's ms of that same round."""

    side: str  # challenger | incumbent
    verdict: str
    reason: str
    message: str = ""
    speedup_eager: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    candidate_ms: float | None = None
    rounds: tuple[float, ...] = ()
    seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.side not in ("challenger", "incumbent"):
            raise ValueError(f"unknown duel side {self.side!r}")
        object.__setattr__(self, "rounds", tuple(float(r) for r in self.rounds))


@dataclass(frozen=True)
class Duel:
    """A challenger that ranked above the best, re-timed against it back to back; `speedup` is the challenger's
    over the incumbent (> 1: faster), paired, None when it was not measured."""

    task_hash: str
    challenger_id: int
    incumbent_id: int
    outcome: DuelOutcome
    note: str
    run_id: str | None = None
    speedup: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    n_pairs: int = 0
    legs: tuple[DuelLeg, ...] = ()
    seconds: float = 0.0
    id: int = 0
    uid: str = ""
    created: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "outcome", DuelOutcome(self.outcome))
        object.__setattr__(self, "legs", tuple(self.legs))
        measured = self.speedup is not None
        if measured and not (self.ci_low is not None and self.ci_high is not None
                             and self.ci_low <= self.speedup <= self.ci_high):
            raise ValueError(f"duel speedup {self.speedup} lies outside its interval [{self.ci_low}, {self.ci_high}]")
        if self.outcome is DuelOutcome.CROWNED and not (measured and self.ci_low > 1.0):
            raise ValueError("a challenger is crowned only on a paired interval above 1.0")
        if self.outcome is DuelOutcome.SLOWER and not (measured and self.ci_high < 1.0):
            raise ValueError("a duel says slower only on a paired interval below 1.0")
        if self.outcome is DuelOutcome.WITHIN_NOISE and self.legs:
            raise ValueError("a challenger that was not re-timed has no legs")

    @property
    def crowned(self) -> bool:
        return self.outcome is DuelOutcome.CROWNED

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["outcome"] = self.outcome.value
        return d


@dataclass(frozen=True)
class Run:
    id: str
    task_path: str
    task_hash: str
    proposer: str
    device: str
    config: dict[str, Any]
    started: str
    finished: str | None = None
    stop_reason: str | None = None


@dataclass(frozen=True)
class Batch:
    """One `crucible batch` over a folder; its tasks' rows live in `batch_tasks` (Archive.batch_rows)."""

    id: str
    folder: str
    device: str
    config: dict[str, Any]
    started: str
    finished: str | None = None


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
            for version, script in enumerate(MIGRATIONS[current:], start=current + 1):
                # executescript commits first, so the script carries its own transaction.
                self._db.executescript(f"BEGIN IMMEDIATE;\n{script}\n"
                                       f"INSERT INTO schema_version VALUES ({version}, '{now()}');\nCOMMIT;")

    def _one(self, sql: str, params: tuple | list = ()) -> sqlite3.Row | None:
        """One row of a read. Reads take the lock too: one sqlite3 connection used by two threads at once fails
        ("bad parameter or other API misuse": two batch lanes, run P)."""
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

    # ---- browsing (issue 8) ---------------------------------------------------------------------------------
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


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and v == v else None


def rows(cands: Iterable[Candidate]) -> list[dict[str, Any]]:
    return [c.summary() for c in cands]

"""The archive's SQLite schema: the migrations that build it, applied in order, each exactly once.

A new table or column is a new script appended to MIGRATIONS; a shipped script is never edited, so every archive,
however old, reaches the same schema by running the scripts it has not yet run (`Archive._migrate`).
"""
from __future__ import annotations

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

"""The archive: schema migrations applied once and in order, sources deduplicated, typed records round-tripped."""
import json
import sqlite3

import pytest

from agent.archive import records, schema, store
from agent.archive.records import Candidate, Run, Timings, sha256
from agent.archive.store import Archive

TIMING = {
    "candidate_ms": 0.25,
    "baselines": {"eager": {"ms": 0.5, "speedup": 2.0, "ci_low": 1.9, "ci_high": 2.1, "significant": True},
                  "compile": {"ms": 0.3, "speedup": 1.2, "ci_low": 1.1, "ci_high": 1.3, "significant": True}},
    "roofline": {"bytes": 1e6, "flops": 0, "gbps": 4000.0, "tflops": 0.0, "pct_of_roofline": 83.5, "bound": "memory"},
    "kernels": [],
}


def cand(**kw) -> Candidate:
    base = dict(task_path="tasks/t.py", task_hash="h1", origin="tuner", proposer="tuner", verdict="rejected",
                reason="output_mismatch", stage="correctness")
    base.update(kw)
    return Candidate(**base)


def test_fresh_archive_is_wal_at_the_latest_schema(tmp_path):
    path = tmp_path / "a.db"
    with Archive(path) as a:
        assert a.schema_version() == len(schema.MIGRATIONS)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"schema_version", "sources", "runs", "candidates"} <= tables
    assert db.execute("SELECT COUNT(*) FROM schema_version").fetchone()[0] == len(schema.MIGRATIONS)


def test_migrations_append_only_and_applied_once(tmp_path, monkeypatch):
    path = tmp_path / "a.db"
    with Archive(path) as a:
        kept = a.add(cand(source="x = 1\n"))
    # A later release appends a migration: an existing archive gets only that one, its rows intact.
    monkeypatch.setattr(schema, "MIGRATIONS",
                        schema.MIGRATIONS + ["ALTER TABLE candidates ADD COLUMN status TEXT DEFAULT 'fresh';"])
    with Archive(path) as a:
        assert a.schema_version() == len(schema.MIGRATIONS)
        assert a.get(kept.id).source == "x = 1\n"
    with Archive(path) as a:  # reopening applies nothing twice (a second ALTER would raise)
        assert a.schema_version() == len(schema.MIGRATIONS)
    db = sqlite3.connect(path)
    assert db.execute("SELECT status FROM candidates").fetchone()[0] == "fresh"
    assert [r[0] for r in db.execute("SELECT version FROM schema_version ORDER BY version")] == \
        list(range(1, len(schema.MIGRATIONS) + 1))


def test_sources_are_stored_once_by_hash(tmp_path):
    with Archive(tmp_path / "a.db") as a:
        src = "import triton\n# kernel\n"
        first = a.add(cand(source=src))
        second = a.add(cand(source=src, verdict="accepted", reason="ok", stage="robustness"))
        other = a.add(cand(source=src + "# v2\n", task_hash="h2"))
        assert first.source_sha == second.source_sha == sha256(src)
        assert first.id != second.id and first.uid != second.uid
        n_sources = a._db.execute("SELECT COUNT(*) FROM sources").fetchone()[0]
        assert n_sources == 2
        assert a.known_sources("h1", timed=False) == {sha256(src)}
        assert a.known_sources("h2", timed=False) == {other.source_sha}
        assert a.known_sources("h1", timed=True) == set()  # a CPU verdict says nothing about GPU timing


def test_interrupted_and_sourceless_candidates(tmp_path):
    with Archive(tmp_path / "a.db") as a:
        a.add(cand(source="y = 2\n", verdict="interrupted", reason="interrupted", stage=None))
        no_code = a.add(cand(reason="no_code", stage="propose", message="the reply was empty"))
        assert a.known_sources("h1", timed=False) == set()  # interrupted: may be evaluated again
        got = a.get(no_code.id)
        assert got.source is None and got.source_sha is None and got.message == "the reply was empty"


def test_record_round_trip_with_timings_and_elites(tmp_path):
    with Archive(tmp_path / "a.db") as a:
        a.add_run(Run(id="r1", task_path="tasks/t.py", task_hash="h1", proposer="tuner", device="cuda",
                      config={"budget": 5}, started=records.now()))
        seed = a.add(cand(origin="seed", proposer="seed", source="s\n", verdict="accepted", reason="ok", run_id="r1",
                          timed=True, timings=Timings.from_check(TIMING), env={"gpu": "H200"}))
        child = a.add(cand(source="c\n", parent_id=seed.id, run_id="r1", input_tokens=10, output_tokens=5,
                           cost_usd=0.01, diagnostics={"verdict": "rejected"}))
        got = a.get(seed.id)
        assert got.timings.speedup_eager == 2.0 and got.timings.eager_ci_low == 1.9
        assert got.timings.speedup_compile == 1.2 and got.timings.pct_roofline == 83.5
        assert got.speedup == 2.0 and got.env == {"gpu": "H200"}
        assert a.get(child.id).diagnostics == {"verdict": "rejected"} and a.get(child.id).parent_id == seed.id
        assert [e.id for e in a.elites("h1", timed=True)] == [seed.id]
        assert a.elites("h1", timed=False) == []
        usage = a.run_usage("r1")
        assert usage == {"proposals": 1, "input_tokens": 10, "output_tokens": 5, "cost_usd": pytest.approx(0.01)}
        a.finish_run("r1", "budget spent")
        assert a.get_run("r1").stop_reason == "budget spent" and a.latest_run("h1").id == "r1"
        assert [c.id for c in a.candidates(task="t.py")] == [seed.id, child.id]
        assert a.candidates(task="other.py") == []
        assert a.get(seed.id).summary()["speedup"] == 2.0
        assert a.get(child.id).summary()["speedup"] is None


def test_records_validate_their_invariants():
    with pytest.raises(ValueError):
        cand(verdict="accepted", reason="ok")  # accepted needs a source
    with pytest.raises(ValueError):
        cand(verdict="accepted", reason="output_mismatch", source="x")
    with pytest.raises(ValueError):
        cand(verdict="maybe")
    with pytest.raises(ValueError):
        cand(origin="oracle")
    assert Timings.from_check(None) == Timings()
    nan = Timings.from_check({"candidate_ms": float("nan"), "baselines": {}})
    assert nan.candidate_ms is None


def test_default_path_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("CRUCIBLE_ARCHIVE", str(tmp_path / "env.db"))
    with Archive() as a:
        assert a.path == tmp_path / "env.db"
    monkeypatch.delenv("CRUCIBLE_ARCHIVE")
    assert str(store.default_path()) == "runs/archive.db"



@pytest.mark.parametrize("read", ["candidates", "known_sources", "run_usage", "runs", "get", "latest_run"])
def test_reads_wait_for_the_archive_lock(tmp_path, read):
    # two `crucible batch` lanes share one archive; reads on its one sqlite3 connection while another thread wrote
    # failed with "InterfaceError: bad parameter or other API misuse" on the H200: every read takes the lock
    import threading
    a = Archive(tmp_path / "a.db")
    a.add_run(Run("r1", "t.py", "h1", "tuner", "cpu", {}, "2026-01-01T00:00:00"))
    first = a.add(cand(run_id="r1", source="x"))
    calls = {"candidates": lambda: a.candidates(run_id="r1"), "known_sources": lambda: a.known_sources("h1", timed=False),
             "run_usage": lambda: a.run_usage("r1"), "runs": a.runs, "get": lambda: a.get(first.id),
             "latest_run": lambda: a.latest_run("h1")}
    done = threading.Event()
    with a._lock:  # another thread's write in progress
        t = threading.Thread(target=lambda: (calls[read](), done.set()))
        t.start()
        assert not done.wait(0.3), f"{read} read the connection while another thread held it"
    assert done.wait(5)
    t.join()


# ---- duels (agent/search/duel.py) ------------------------------------------------------------------------------------------
def _duel_pair(a: Archive) -> tuple[Candidate, Candidate]:
    inc = a.add(cand(verdict="accepted", reason="ok", stage="timing", source="inc = 1\n", timed=True))
    chal = a.add(cand(verdict="accepted", reason="ok", stage="timing", source="chal = 1\n", timed=True))
    return inc, chal


def test_duel_round_trip_and_show(tmp_path, capsys):
    from agent.archive.records import Duel, DuelLeg, DuelOutcome
    from agent.cli import main

    path = tmp_path / "a.db"
    with Archive(path) as a:
        inc, chal = _duel_pair(a)
        legs = tuple(DuelLeg(side=s, verdict="accepted", reason="ok", speedup_eager=10.0 + i / 10, ci_low=9.9,
                             ci_high=10.5, candidate_ms=0.1, rounds=[0.1, 0.1001, 0.0999], seconds=3.0)
                     for i, s in enumerate(("challenger", "incumbent", "challenger", "incumbent")))
        tied = a.add_duel(Duel(task_hash="h1", challenger_id=chal.id, incumbent_id=inc.id,
                               outcome=DuelOutcome.NO_DIFFERENCE, note="re-timed back to back", speedup=1.004,
                               ci_low=0.99, ci_high=1.02, n_pairs=60, legs=legs, seconds=12.0))
        assert tied.id and tied.uid and tied.created
        (back,) = a.duels(candidate_id=inc.id)
        assert back == tied and back.legs[0].rounds == (0.1, 0.1001, 0.0999)
        assert back.outcome is DuelOutcome.NO_DIFFERENCE
        assert a.duels(candidate_id=chal.id) == [tied] and a.duels(task_hash="h2") == []
        assert a.uncrowned("h1") == {chal.id}
        # a challenger crowned in a later duel is no longer held back
        a.add_duel(Duel(task_hash="h1", challenger_id=chal.id, incumbent_id=inc.id, outcome="crowned", note="",
                        speedup=1.05, ci_low=1.03, ci_high=1.07, n_pairs=60))
        assert a.uncrowned("h1") == set()
    assert main(["archive", "show", str(inc.id), "--archive", str(path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"#{chal.id} vs #{inc.id}: 1.004x [0.99, 1.02], no significant difference, #{inc.id} stays best" in out
    assert main(["archive", "show", str(chal.id), "--json", "--archive", str(path)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [d["outcome"] for d in shown["duels"]] == ["no significant difference", "crowned"]


def test_an_archive_from_before_duels_opens_and_migrates(tmp_path, monkeypatch):
    path = tmp_path / "old.db"
    monkeypatch.setattr(schema, "MIGRATIONS", schema.MIGRATIONS[:2])  # the schema before duels
    with Archive(path) as a:
        inc, chal = _duel_pair(a)
    monkeypatch.undo()
    db = sqlite3.connect(path)
    assert "duels" not in {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    db.close()
    with Archive(path) as a:
        assert a.schema_version() == len(schema.MIGRATIONS)
        assert a.duels() == [] and a.uncrowned("h1") == set()
        assert a.get(chal.id).source == "chal = 1\n"


def test_duel_records_validate_their_invariants():
    from agent.archive.records import Duel, DuelLeg, DuelOutcome

    common = dict(task_hash="h", challenger_id=2, incumbent_id=1, note="")
    with pytest.raises(ValueError, match="crowned only"):
        Duel(outcome=DuelOutcome.CROWNED, speedup=1.01, ci_low=0.99, ci_high=1.03, **common)
    with pytest.raises(ValueError, match="crowned only"):
        Duel(outcome=DuelOutcome.CROWNED, **common)
    with pytest.raises(ValueError, match="slower only"):
        Duel(outcome=DuelOutcome.SLOWER, speedup=0.99, ci_low=0.97, ci_high=1.01, **common)
    with pytest.raises(ValueError, match="outside its interval"):
        Duel(outcome=DuelOutcome.NO_DIFFERENCE, speedup=1.2, ci_low=0.99, ci_high=1.01, **common)
    with pytest.raises(ValueError):
        Duel(outcome="won", **common)
    with pytest.raises(ValueError, match="duel side"):
        DuelLeg(side="referee", verdict="accepted", reason="ok")
    with pytest.raises(ValueError, match="no legs"):
        Duel(outcome=DuelOutcome.WITHIN_NOISE, legs=(DuelLeg(side="challenger", verdict="accepted", reason="ok"),),
             **common)

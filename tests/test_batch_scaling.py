"""benchmarks/batch_scaling.py: the batch-scaling arithmetic (verified candidates per minute per GPU, scaling) and its
checks for candidates evaluated twice or lost, on small archives written here."""
import json
import sqlite3
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import batch_scaling  # noqa: E402


def at(seconds):
    """A timestamp `seconds` after 10:00:00, as the archive writes them (None: a run that never finished)."""
    return None if seconds is None else f"2026-11-29T10:{seconds // 60:02d}:{seconds % 60:02d}+00:00"


def batch(tmp_path, name, runs):
    """runs: (run id, (start s, end s) or the seconds of a run from 0, proposals, [(origin, source, verdict)])."""
    db = tmp_path / f"{name}.db"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE runs (id TEXT, started TEXT, finished TEXT)")
    con.execute("CREATE TABLE candidates (run_id TEXT, origin TEXT, source_sha TEXT, verdict TEXT)")
    summary = []
    for run, span, proposals, cands in runs:
        start, end = span if isinstance(span, tuple) else (0, span)
        con.execute("INSERT INTO runs VALUES (?, ?, ?)", (run, at(start), at(end)))
        con.executemany("INSERT INTO candidates VALUES (?, ?, ?, ?)", [(run, *c) for c in cands])
        summary.append({"run_id": run, "proposals": proposals})
    con.commit()
    out = tmp_path / f"{name}.json"
    out.write_text(json.dumps(summary))
    return str(db), str(out)


def clean(run, n, seconds):
    return (run, seconds, n, [("seed", "s0", "accepted")] + [("tuner", f"s{i}", "accepted") for i in range(1, n + 1)])


def test_scaling_is_verified_per_minute_of_many_over_one(tmp_path, capsys):
    one = batch(tmp_path, "one", [clean("a", 4, (0, 60)), clean("b", 4, (60, 120))])  # 10 verified in 2 min
    many = batch(tmp_path, "many", [clean("c", 4, (0, 30)), clean("d", 4, (30, 63))])  # 10 in 63 s
    assert batch_scaling.main([*one, *many, "--gpus", "2", "--out", str(tmp_path / "r.json")]) == 0
    r = json.loads((tmp_path / "r.json").read_text())
    assert abs(r["scaling"] - 120 / 63) < 1e-9
    assert r["one"]["verified"] == 10 and abs(batch_scaling.read(*one, 1).verified_per_min_per_gpu - 5.0) < 1e-9
    assert "scaling on 2 GPUs: 1.90x" in capsys.readouterr().out


def test_a_source_evaluated_twice_or_a_lost_proposal_fails(tmp_path):
    one = batch(tmp_path, "one", [clean("a", 4, 60)])
    twice = batch(tmp_path, "twice", [("c", 30, 2, [("seed", "s0", "accepted"), ("tuner", "s1", "accepted"),
                                                    ("tuner", "s1", "accepted")])])
    lost = batch(tmp_path, "lost", [("d", 30, 3, [("seed", "s0", "accepted"), ("tuner", "s1", "accepted"),
                                                  ("tuner", "s2", None)])])  # one never evaluated, one missing
    assert batch_scaling.read(*twice, 2).duplicates == 1
    assert batch_scaling.read(*lost, 2).lost == 2
    assert batch_scaling.main([*one, *twice, "--gpus", "2"]) == 1
    assert batch_scaling.main([*one, *lost, "--gpus", "2"]) == 1


def test_wall_time_is_the_span_of_overlapping_runs_not_their_sum(tmp_path):
    """One task per GPU: runs overlap, so the batch took from the first start to the last finish."""
    lanes = batch(tmp_path, "lanes", [clean("a", 2, (0, 40)), clean("b", 2, (1, 30)), clean("c", 2, (30, 75))])
    assert batch_scaling.read(*lanes, 2).wall_s == 75  # the sum of the runs would be 40 + 29 + 45 = 114
    killed = batch(tmp_path, "killed", [clean("a", 2, (5, 40)), clean("b", 2, (3, None))])
    assert batch_scaling.read(*killed, 2).wall_s == 37  # the unfinished run still started the batch

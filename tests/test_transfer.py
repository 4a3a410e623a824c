"""Duels through `crucible archive export`/`import` (agent/archive/transfer.py): named by candidate uid, relinked to local
ids on import, added once however often a file is imported, filtered with their task, skipped (and counted) when a
side is in neither the file nor the archive; and the header's format rule that keeps an older reader out of them.

The duels are decided by agent/search/duel.py's `Bout` from legs written here, so their notes, intervals and pair counts
are the loop's own.
"""
import dataclasses
import json
import random
from pathlib import Path

import pytest

from agent.archive import transfer
from agent.archive.records import Candidate, DuelLeg, DuelOutcome, Run, Timings
from agent.archive.store import Archive
from agent.cli import main
from agent.search.duel import LEGS, Bout, not_contested
from agent.archive.transfer import TransferError, dump_file, load_file


def leg(side: str, ratio: float, seed: int, *, rounds: bool = True) -> DuelLeg:
    """A timed leg whose kernel runs at `ratio` of eager's time, 30 rounds of 0.4% noise (or whole-check only)."""
    rng = random.Random(seed)
    per_round = tuple(ratio * (1 + 0.004 * rng.gauss(0, 1)) for _ in range(30))
    speed = 1 / ratio
    return DuelLeg(side=side, verdict="accepted", reason="ok", message="ok", speedup_eager=speed,
                   ci_low=speed * 0.99, ci_high=speed * 1.01, candidate_ms=ratio * 10,
                   rounds=per_round if rounds else (), seconds=2.5 + seed)


def fought(challenger: Candidate, incumbent: Candidate, ratios: dict[str, float], run_id: str, *,
           rounds: bool = True):
    bout = Bout(challenger, incumbent, slot=0, paths={})
    bout.legs = [leg(side, ratios[side], n, rounds=rounds) for n, side in enumerate(LEGS)]
    return bout.decide(run_id)


def add(a: Archive, task: str, task_hash: str, run_id: str | None, speed: float, **kw) -> Candidate:
    return a.add(Candidate(task_path=f"/elsewhere/tasks/{task}", task_hash=task_hash, origin=kw.pop("origin", "tuner"),
                           proposer="tuner", verdict="accepted", reason="ok", stage="timing", run_id=run_id,
                           source=f"# {task} at {speed}x\nimport triton\n", timed=True,
                           timings=Timings(candidate_ms=1 / speed, speedup_eager=speed, eager_ci_low=speed - 0.05,
                                           eager_ci_high=speed + 0.05), **kw))


def run(a: Archive, run_id: str, task: str, task_hash: str) -> None:
    a.add_run(Run(run_id, f"/elsewhere/tasks/{task}", task_hash, "tuner", "cuda", {"budget": 4},
                  "2026-12-01T09:00:00+00:00"))


@pytest.fixture
def dueled(tmp_path):
    """softmax: a seed, a challenger crowned over it and one not re-timed against the new best. rope: a seed and a
    challenger re-timed to no significant difference, whole checks only, in a resumed run that added no kernel."""
    path = tmp_path / "dueled.db"
    with Archive(path) as a:
        run(a, "r-soft", "softmax_fwd.py", "s1")
        run(a, "r-rope", "rope_fwd.py", "r1")
        run(a, "r-rope-resumed", "rope_fwd.py", "r1")
        seed = add(a, "softmax_fwd.py", "s1", "r-soft", 1.0, origin="seed")
        fast = add(a, "softmax_fwd.py", "s1", "r-soft", 1.3, parent_id=seed.id)
        near = add(a, "softmax_fwd.py", "s1", "r-soft", 1.32, parent_id=fast.id)
        rope_seed = add(a, "rope_fwd.py", "r1", "r-rope", 1.0, origin="seed")
        rope_var = add(a, "rope_fwd.py", "r1", "r-rope", 1.1, parent_id=rope_seed.id)
        crowned = a.add_duel(fought(fast, seed, {"challenger": 0.77, "incumbent": 1.0}, "r-soft"))
        within = a.add_duel(not_contested(near, fast, "r-soft"))
        tied = a.add_duel(fought(rope_var, rope_seed, {"challenger": 1.0, "incumbent": 1.0}, "r-rope-resumed",
                                 rounds=False))
    assert crowned.outcome is DuelOutcome.CROWNED and crowned.n_pairs == 60 and crowned.ci_low > 1.0
    assert within.outcome is DuelOutcome.WITHIN_NOISE and tied.outcome is DuelOutcome.NO_DIFFERENCE
    return path, dict(seed=seed, fast=fast, near=near, rope_seed=rope_seed, rope_var=rope_var, crowned=crowned,
                      within=within, tied=tied)


def busy(path: Path) -> Archive:
    """A target archive with kernels of its own, so imported candidates get other local ids than at the source."""
    a = Archive(path)
    for speed in (0.5, 0.6, 0.7):
        add(a, "layernorm_fwd.py", "l1", None, speed)
    return a


def relinked(m: Archive, src: Archive, d):
    """The source duel as the target should hold it: same record, ids those of the same uids here."""
    here = {side: m.by_uid(src.get(getattr(d, f"{side}_id")).uid)[0].id for side in ("challenger", "incumbent")}
    (mine,) = [x for x in m.duels() if x.uid == d.uid]
    return mine, dataclasses.replace(d, id=mine.id, challenger_id=here["challenger"], incumbent_id=here["incumbent"])


def cli(capsys, *args) -> tuple[int, str]:
    code = main(["archive", *map(str, args)])
    return code, " ".join(capsys.readouterr().out.split())


def test_duels_round_trip_relinked_by_uid_and_import_once(dueled, tmp_path, capsys):
    path, f = dueled
    with Archive(path) as a:
        counts = dump_file(a, tmp_path / "all.jsonl")
    assert counts == {"run": 3, "candidate": 5, "reverification": 0, "duel": 3, "batch": 0}
    lines = [json.loads(line) for line in (tmp_path / "all.jsonl").read_text().splitlines()]
    assert lines[0]["format"] == transfer.FORMAT == "crucible-archive/3"
    kinds = [line["kind"] for line in lines]
    assert kinds.index("duel") > max(i for i, k in enumerate(kinds) if k == "candidate")  # after what they name
    assert all("challenger_id" not in line and "incumbent_id" not in line for line in lines)

    with busy(tmp_path / "m.db") as m, Archive(path) as src:
        merged = load_file(m, tmp_path / "all.jsonl")
        assert merged.added == counts and merged.unmatched_duels == 0
        for name in ("crowned", "within", "tied"):
            mine, expected = relinked(m, src, f[name])
            assert mine == expected  # outcome, note, legs with their rounds, speedup and interval, pairs, run, uid
            assert mine.challenger_id != f[name].challenger_id  # local ids differ: the uids carried the link
        crowned, _ = relinked(m, src, f["crowned"])
        assert crowned.legs == f["crowned"].legs and len(crowned.legs[0].rounds) == 30
        assert (crowned.speedup, crowned.ci_low, crowned.ci_high) == (f["crowned"].speedup, f["crowned"].ci_low,
                                                                      f["crowned"].ci_high)
        near = m.by_uid(f["near"].uid)[0]
        assert m.uncrowned("s1") == {near.id}  # who a duel held back survives the merge

    # the same file again, through the CLI: every duel is already here
    code, out = cli(capsys, "import", tmp_path / "all.jsonl", "--archive", tmp_path / "m.db")
    assert code == 0 and "added 0 candidates, 0 runs, 0 re-checks, 0 duels, 0 batches; skipped 11 already here" in out
    with Archive(tmp_path / "m.db") as m:
        assert len(m.duels()) == 3


def test_a_filtered_export_carries_only_that_tasks_duels(dueled, tmp_path):
    path, f = dueled
    with Archive(path) as a:
        rope = dump_file(a, tmp_path / "rope.jsonl", task="rope_fwd.py")
        soft = dump_file(a, tmp_path / "soft.jsonl", task="softmax_fwd.py")
    assert (rope["duel"], soft["duel"]) == (1, 2)
    with Archive(tmp_path / "r.db") as r:
        load_file(r, tmp_path / "rope.jsonl")
        (duel,) = r.duels()
        assert duel.uid == f["tied"].uid and duel.task_hash == "r1"
        assert duel.run_id == "r-rope-resumed" and r.get_run("r-rope-resumed") is not None  # its run came along
        assert r.get(duel.incumbent_id).uid == f["rope_seed"].uid
    with Archive(tmp_path / "s.db") as s:
        load_file(s, tmp_path / "soft.jsonl")
        assert {d.uid for d in s.duels()} == {f["crowned"].uid, f["within"].uid}
        assert {c.task_hash for c in s.candidates()} == {"s1"}


def test_a_duel_without_its_candidates_is_skipped_and_counted(dueled, tmp_path, capsys):
    path, f = dueled
    with Archive(path) as a:
        dump_file(a, tmp_path / "all.jsonl")
    lines = (tmp_path / "all.jsonl").read_text().splitlines()
    cut = [line for line in lines if json.loads(line).get("uid") != f["rope_seed"].uid]
    assert len(cut) == len(lines) - 1
    (tmp_path / "cut.jsonl").write_text("\n".join(cut) + "\n")

    code, out = cli(capsys, "import", tmp_path / "cut.jsonl", "--archive", tmp_path / "m.db")
    assert code == 0 and "2 duels, 0 batches;" in out
    assert "1 duels skipped, their challenger or incumbent in neither the file nor the archive" in out
    with Archive(tmp_path / "m.db") as m:
        assert {d.uid for d in m.duels()} == {f["crowned"].uid, f["within"].uid}
        assert m.by_uid(f["rope_var"].uid)  # the challenger itself is kept, without the duel
        # skipped is not remembered as seen: once the incumbent arrives, the duel links
        merged = load_file(m, tmp_path / "all.jsonl")
        assert (merged.added["duel"], merged.skipped["duel"], merged.unmatched_duels) == (1, 2, 0)
        (tied,) = m.duels(task_hash="r1")
        assert m.get(tied.incumbent_id).uid == f["rope_seed"].uid


def test_format_rule_older_files_read_newer_refused_at_the_header(dueled, tmp_path, monkeypatch):
    path, _ = dueled
    with Archive(path) as a:
        dump_file(a, tmp_path / "all.jsonl")
    # an older crucible (one that reads /1 only) stops at line 1 with one sentence, before it adds anything
    monkeypatch.setattr(transfer, "READS", ("crucible-archive/1",))
    with Archive(tmp_path / "old.db") as old:
        with pytest.raises(TransferError) as err:
            load_file(old, tmp_path / "all.jsonl")
        assert old.candidates() == [] and old.runs() == []
    message = str(err.value)
    assert "'crucible-archive/3'" in message and "newer crucible" in message and message.count(". ") == 0
    monkeypatch.undo()
    # a file of that older crucible still imports here
    v1 = [line for line in (tmp_path / "all.jsonl").read_text().splitlines() if json.loads(line)["kind"] != "duel"]
    v1[0] = json.dumps({"kind": "header", "format": "crucible-archive/1"})
    (tmp_path / "v1.jsonl").write_text("\n".join(v1) + "\n")
    with Archive(tmp_path / "new.db") as new:
        assert load_file(new, tmp_path / "v1.jsonl").added["candidate"] == 5 and new.duels() == []
    # a bad duel line is one sentence that names the line
    bad = json.loads((tmp_path / "all.jsonl").read_text().splitlines()[-1])
    bad["uid"], bad["outcome"], bad["speedup"] = "f" * 32, "crowned", 0.9
    (tmp_path / "bad.jsonl").write_text(json.dumps(bad) + "\n")
    with Archive(tmp_path / "new.db") as new, pytest.raises(TransferError, match="line 1: not a duel record"):
        load_file(new, tmp_path / "bad.jsonl")


def test_batches_travel_with_a_whole_archive_and_import_once(tmp_path, capsys):
    """A batch and its task rows survive export and import (the KernelBench table rebuilds from the merged archive);
    a task's filtered export leaves batches out; a second import adds nothing; a batch line without task rows is
    one sentence naming the line."""
    from agent.archive.records import Batch
    rows = [{"task": "/k/level1/19_ReLU.py", "status": "done", "correct": True, "speedup_eager": 1.5},
            {"task": "/k/level1/23_Softmax.py", "status": "done", "correct": False, "note": "rejected"}]
    with Archive(tmp_path / "a.db") as a:
        a.add_batch(Batch("b1", "/k/level1", "cuda", {"budget": 0}, "2026-12-03T13:50:00+00:00"))
        for i, row in enumerate(rows):
            a.set_batch_row("b1", i, row)
        counts = dump_file(a, tmp_path / "all.jsonl")
        assert counts["batch"] == 1
        assert dump_file(a, tmp_path / "one.jsonl", task="/k/level1/19_ReLU.py")["batch"] == 0
    with Archive(tmp_path / "m.db") as m:
        assert load_file(m, tmp_path / "all.jsonl").added["batch"] == 1
        assert m.get_batch("b1").config == {"budget": 0} and m.batch_rows("b1") == rows
        again = load_file(m, tmp_path / "all.jsonl")
        assert again.added["batch"] == 0 and again.skipped["batch"] == 1 and m.batch_rows("b1") == rows
    bad = json.loads([line for line in (tmp_path / "all.jsonl").read_text().splitlines() if '"batch"' in line][0])
    bad["id"], bad["rows"] = "b2", [{"no": "task"}]
    (tmp_path / "bad.jsonl").write_text(json.dumps(bad) + "\n")
    with Archive(tmp_path / "n.db") as n, pytest.raises(TransferError, match="line 1: not a batch record"):
        load_file(n, tmp_path / "bad.jsonl")

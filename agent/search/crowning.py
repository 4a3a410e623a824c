"""The coordinator's crowning half: a challenger re-timed against the best before it takes the title, and the
run's best re-checked once more at the end.

`Crowning` is a part of the search loop's coordinator (agent/search/loop.py). On a GPU a candidate that ranks above
the best on its own check waits as a challenger; one duel at a time (agent/search/duel.py decides it) re-times the
two back to back on one slot, and every duel is archived. At the end the best is checked from the start once more and
timed against the final baselines (agent/archive/reverify.py records it). Past the run's time limit no duel starts
and the one in flight ends with the legs it has: the challengers left are archived unfought (else every challenger
queued by then is duelled, four re-timings each, however far past the limit that goes). It reads and writes the
coordinator's state; it runs on the coordinating thread only.
"""
from __future__ import annotations

import concurrent.futures as cf
import logging
import os
import threading
import time
from pathlib import Path

from agent.archive.records import Candidate, Duel, sha256
from agent.search import duel as duel_mod
from agent.search.proposing import rank, speed
from agent.search.runs import EventKind

log = logging.getLogger(__name__)


class Crowning:
    """Duels before a new best is crowned, and the final re-check of the best (a part of the loop's coordinator)."""

    def _crown(self, cand: Candidate, why: str = "") -> None:
        self.best = cand
        if cand.timed:
            self._emit(EventKind.NEW_BEST, f"new best #{cand.id}: {speed(cand)}{why}", cand)

    def _past_time_limit(self) -> bool:
        limit = self.config.time_limit_s
        return limit is not None and time.monotonic() - self.started >= limit

    def _start_duel(self) -> None:
        if self.challengers and self._past_time_limit():
            while self.challengers:
                self._archive_duel(duel_mod.queued_unfought(self.challengers.popleft(), self.best, self.run_id))
        while self.bout is None and self.challengers and self.free_slots and not self.stop.is_set():
            cand, best = self.challengers.popleft(), self.best
            assert best is not None
            if rank(cand) <= rank(best):
                continue  # a duel since crowned a kernel that ranks at least as high
            if not duel_mod.contest(cand, best, self.duels):
                self._archive_duel(duel_mod.not_contested(cand, best, self.run_id, self.duels))
                continue
            paths = {duel_mod.CHALLENGER: self._source_file(cand, "duels"),
                     duel_mod.INCUMBENT: self._source_file(best, "duels")}
            self.bout = duel_mod.Bout(cand, best, self.free_slots.pop(), paths)
            self._next_leg()  # first, so the note's progress counts the leg's check in flight
            self._emit(EventKind.NOTE, f"#{cand.id} ({speed(cand)}) ranks above the best #{best.id} ({speed(best)}) "
                                       f"on its own check: re-timing both back to back before crowning it", cand)

    def _next_leg(self) -> None:
        """The bout's next leg on its slot; past the time limit, after its first leg, the bout ends instead."""
        bout = self.bout
        assert bout is not None
        if bout.legs and self._past_time_limit():
            self._end_duel()
            return
        bout.leg_started = time.monotonic()
        bout.future = self.session.submit(bout.slot, bout.paths[bout.side], baselines=duel_mod.BASELINES,
                                          retime=True)

    def _take_leg(self) -> None:
        """The finished check of the bout's current leg becomes a leg record."""
        bout = self.bout
        assert bout is not None and bout.future is not None and bout.future.done()
        future, bout.future = bout.future, None
        seconds = time.monotonic() - bout.leg_started
        exc = future.exception()
        if exc is not None:
            log.warning("harness failed on a duel leg of %s", bout.paths[bout.side], exc_info=exc)
            self.session.reset(bout.slot)
            bout.legs.append(duel_mod.failed_leg(bout.side, exc, seconds))
        else:
            bout.legs.append(duel_mod.leg(bout.side, future.result(), seconds))

    def _end_duel(self) -> None:
        bout, self.bout = self.bout, None
        assert bout is not None
        self.free_slots.append(bout.slot)
        result = self._archive_duel(bout.decide(self.run_id))
        if result.crowned:
            self._crown(bout.challenger, f" (paired re-time: {result.speedup:.3f}x #{bout.incumbent.id})")

    def _archive_duel(self, d: Duel) -> Duel:
        d = self.archive.add_duel(d)
        self.duels.append(d)
        if not d.crowned:
            self.uncrowned.add(d.challenger_id)
        self._emit(EventKind.DUEL, duel_mod.headline(d),
                   next((c for c in self.elites if c.id == d.challenger_id), None))
        return d

    def _final_check(self) -> None:
        """The run's best, checked once more from the start (fresh hidden seeds, every stage) and timed against the
        final baselines: the verdict a user acts on is never a single lucky check, and torch.compile and Liger are
        timed once per run rather than once per candidate."""
        from agent.archive import reverify

        best = self.best
        if best is None or not best.timed or not self.timed:
            return
        path = self._source_file(best, "final")
        names = ", ".join(self.config.final_baselines)
        self._emit(EventKind.NOTE, f"final re-check of the best kernel #{best.id}, timed against {names}", best)
        future = self.session.submit(0, path, baselines=tuple(self.config.final_baselines))
        while not future.done():
            if self.stop.is_set():
                self._emit(EventKind.NOTE, "final re-check abandoned: the run was stopped")
                return
            cf.wait([future], timeout=0.25)
        exc = future.exception()
        if exc is not None:
            self.session.reset(0)
            self.notes.append(f"the final re-check of #{best.id} failed in the harness: {type(exc).__name__}: {exc}")
            return
        self.final = self.archive.add_reverification(reverify.record(best, future.result()))
        self._emit(EventKind.NOTE, f"final re-check of #{best.id}: {self.final.status}: {self.final.note}", best)
        if self.final.status != "confirmed":
            self.notes.append(f"the best kernel #{best.id} did not hold up in its final re-check: {self.final.note}")

    def _dueling(self) -> int:
        """The duel's check running now: one at most, since its legs run one after another on one slot."""
        return int(self.bout is not None and self.bout.future is not None)

    def _source_file(self, cand: Candidate, folder: str) -> Path:
        """The candidate's source as a file under the run's folder, for a check that is not a proposal's."""
        cand = self.archive.with_source(cand)
        path = self.run_dir / folder / f"{(cand.source_sha or sha256(cand.source or ''))[:16]}.py"
        path.parent.mkdir(exist_ok=True)
        tmp = path.with_name(f".{path.name}.{threading.get_ident()}")
        tmp.write_text(cand.source or "", encoding="utf-8")
        os.replace(tmp, path)  # whole: a check reading the file never sees it half written
        return path

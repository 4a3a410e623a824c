"""The search loop: propose (LLM or tuner) and evaluate (the harness) concurrently, archive everything.

One coordinating thread owns the archive and the search; LLM requests run on daemon threads, so that a stop never
waits for a slow request. Evaluations go through an executor (agent/search/executors.py), which says how many slots
the run has and on what device: by default warm harnesses on this machine, several per GPU (one candidate compiles while
another is timed, alone on the GPU), or one on the CPU, where the harness checks correctness through Triton's
interpreter and nothing is timed; or actors across a Ray cluster.

Every finished candidate is committed as soon as its verdict is known. A stop (Ctrl-C, SIGTERM: the caller sets
`stop`) records candidates still under evaluation as interrupted and ends; a kill loses at most those. `resume`
continues a run under the same id, counting what it already spent against the budgets.

On a GPU a candidate that ranks above the best on its own check is only a challenger: before it is crowned, it and
the incumbent are re-timed back to back on one slot (challenger, incumbent, challenger, incumbent;
agent/search/duel.py), and it becomes the best only if that paired comparison says faster with its interval above
1.0. At most one duel runs at a time, only for a challenger whose lower bound clears the incumbent's standing (its
speedup, re-timed in earlier duels too); its checks are not proposals (they spend time, not budget), every duel is
archived, and the final re-check is of the paired winner.

Library code: progress goes to the `on_event` callback, never to the terminal.

This module is the control flow; the pieces live apart: the run's records (RunConfig, Event, RunSummary) in
agent/search/runs.py, checking and completing a run's settings before it starts in agent/search/prepare.py, what a
proposal asks the tuner or the LLM for in agent/search/proposing.py, sending requests and taking replies in in
agent/search/issuing.py, duels and the final re-check in agent/search/crowning.py. The public names of runs.py and
executors.py stay importable from here.
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import logging
import threading
import time
from collections import deque
from dataclasses import replace
from typing import Callable

from agent.archive.records import Candidate, Duel, Reverification, Run, Timings, now, sha256
from agent.archive.store import Archive
from agent.llm.chat import Provider, ProviderError
from agent.llm.extract import normal_form
from agent.llm.pool import ModelPool
from agent.search import duel as duel_mod
from agent.search import reflect
from agent.search import tuner as tuner_mod
from agent.search.crowning import Crowning
from agent.search.elites import Search, Selection, best_of, niche
from agent.search.executors import (Evaluator, EvaluatorFactory, Executor, ExecutorError,  # noqa: F401 - the loop's API
                                    HarnessEvaluator, LocalExecutor)
from agent.search.flatten import flatten
from agent.search.issuing import Issuing, MemoryCuts
from agent.search.prepare import new_run_id, open_task, prepare, resolve_start
from agent.search.proposing import Pending, rank, speed, tuner_feedback
from agent.search.runs import (DEFAULT_BUDGET, Event, EventKind, LoopError, Progress,  # noqa: F401 - the loop's API
                               RunConfig, RunSummary)
from sandbox.records import CheckResult

log = logging.getLogger(__name__)
MAX_PROVIDER_ERRORS = 5  # consecutive failed requests before the run stops: the endpoint is not coming back
PROPOSE_REASONS = ("no_code", "provider_error", "duplicate", "truncated", "edit_failed")  # failed before a check


def run_search(config: RunConfig, archive: Archive, *, provider: Provider | None = None,
               on_event: Callable[[Event], None] | None = None, stop: threading.Event | None = None,
               evaluator_factory: EvaluatorFactory | None = None, executor: Executor | None = None) -> RunSummary:
    """Run (or resume) a search on one task; LoopError when it cannot start.

    Candidates are evaluated by `executor` (the caller's to close), else by warm harnesses in this process made by
    `evaluator_factory` (default: the real harness), one per GPU.
    """
    if executor is None:
        executor = LocalExecutor(evaluator_factory, resolve_device=_device)
    elif evaluator_factory is not None:
        raise ValueError("pass an executor or an evaluator factory, not both")
    return _Coordinator(prepare(config, archive), archive, provider, on_event, stop or threading.Event(),
                        executor).run()


def record_check(base: Candidate, result: CheckResult) -> Candidate:
    # The harness's fingerprint (torch, triton, device) and, when timed, the profiler's (GPU, driver, clocks).
    env = {**(result.environment or {}), **((result.timing or {}).get("environment") or {})}
    env_hash = sha256(json.dumps(env, sort_keys=True, default=str))[:16] if env else None
    return replace(base, verdict=result.verdict.value, stage=result.stage.value, reason=result.reason.value,
                   message=result.message, diagnostics=result.to_dict(), timed=bool(result.timed),
                   timings=Timings.from_check(result.timing), env=env, env_hash=env_hash, eval_s=result.seconds)


class _Coordinator(Issuing, Crowning):
    """One run: owns the archive writes, the search state and the limits; proposes (Issuing), evaluates, records,
    crowns (Crowning)."""

    def __init__(self, config: RunConfig, archive: Archive, provider: Provider | None,
                 on_event: Callable[[Event], None] | None, stop: threading.Event, executor: Executor):
        self.config, self.archive, self.provider, self.stop = config, archive, provider, stop
        self.on_event = on_event or (lambda event: None)
        self.task = open_task(config.task_path)
        self.start_path, self.start_desc = resolve_start(config, self.task.path)
        if provider is None and self.start_path is None:
            raise LoopError(f"no seed kernel is registered for {self.task.path.name} and no model is configured: the "
                            "tuner needs a kernel to tune; pass --from KERNEL.py, or --model openai:NAME / "
                            "anthropic:NAME to let an LLM write the first one")
        price = getattr(provider, "price", None) if provider is not None else None
        if provider is not None and config.max_cost is not None and price is None:
            raise LoopError(f"--max-cost needs a price for {provider.name}, and none is configured: add it to "
                            'CRUCIBLE_PRICES (a JSON file like {"openai:NAME": {"input": 2.5, "output": 10}}, USD per '
                            "million tokens) or drop --max-cost")
        self.priced = provider is None or price is not None
        try:
            self.session = executor.session(self.task, config, archive.path.parent / "sandbox")
        except ExecutorError as exc:
            raise LoopError(str(exc)) from None
        self.device, self.slots = self.session.device, self.session.slots
        self.timed = self.device == "cuda"
        self.budget = config.budget if config.budget is not None else DEFAULT_BUDGET
        self.polish = (0 if provider is None else
                       config.polish if config.polish is not None else self.budget // 5)
        self.search = Search(config.seed)
        self.tuner = tuner_mod.Tuner(config.seed)
        self.started = time.monotonic()
        # what flows through
        self.requests: dict[cf.Future, Pending] = {}
        self.ready: deque[Pending] = deque()
        self.evals: dict[cf.Future, Pending] = {}
        self.free_slots, self.memory = list(range(self.slots))[::-1], MemoryCuts()  # memory: slots given up
        self.in_flight: set[str] = set()
        self.exhausted: set[int] = set()
        self.stop_reason: str | None = None
        self.provider_errors = self.harness_errors = self.replies = 0
        self.provider_failure: str | None = None
        self.notes: list[str] = []
        self._last_recorded: Candidate | None = None
        self.check_times: list[float] = []
        self.final: Reverification | None = None
        self.bout: duel_mod.Bout | None = None  # the duel in flight (at most one)
        self.system: str | None = None  # the system prompt, made at the first request
        self.retried: set[int] = set()  # failed edits and cut-off replies whose kernel was asked about again
        self.challengers: deque[Candidate] = deque()  # waiting for their duel
        self.duels: list[Duel] = []

    # ---- the run ---------------------------------------------------------------------------------------------
    def run(self) -> RunSummary:
        self._open_run()
        try:
            self._start_kernel()
            if self.stop_reason is None:
                self._loop()
            if self.stop_reason != "interrupted":
                self._final_check()
        except BaseException:
            self._interrupt("interrupted")
            raise
        finally:
            self._close()
        return self._finish()

    def _open_run(self) -> None:
        c, task = self.config, self.task
        if c.resume:
            run = self.archive.get_run(c.resume)
            assert run is not None
            self.run_id = run.id
        else:
            self.run_id = new_run_id(task)
            self.archive.add_run(Run(id=self.run_id, task_path=str(task.path), task_hash=task.source_hash,
                                     proposer=c.model or tuner_mod.NAME, device=self.device,
                                     config={**c.stored(), "device": self.device, "budget": self.budget},
                                     started=now()))
        self.run_dir = self.archive.path.parent / self.run_id
        (self.run_dir / "candidates").mkdir(parents=True, exist_ok=True)
        done = self.archive.run_usage(self.run_id)
        self.issued = self.issued_before = done["proposals"]
        self.tokens_in, self.tokens_out, self.cost = done["input_tokens"], done["output_tokens"], done["cost_usd"]
        mine = self.archive.candidates(run_id=self.run_id)
        self.accepted = sum(c.accepted for c in mine if c.origin != "seed")
        self.rejected = sum(c.verdict == "rejected" for c in mine if c.origin != "seed")
        self.counted_before = self.accepted + self.rejected
        self.llm_requests = sum(c.origin == "llm" for c in mine)
        self.verified_llm = sum(c.origin == "llm" and c.accepted for c in mine)
        if any(c.origin == "llm" and c.output_tokens and c.cost_usd is None for c in mine):
            self.priced = False
        self.known = self.archive.known_sources(task.source_hash, timed=self.timed)
        self.elites = [self.archive.with_source(c) for c in self.archive.elites(task.source_hash, timed=self.timed)]
        self.failures = [self.archive.with_source(c) for c in mine
                         if c.verdict == "rejected" and c.source_sha and c.stage != "propose"]
        self.history = list(mine)  # this run's records: the attempts each prompt lists (agent/search/proposing.py)
        # what has worked for this task: the latest reflection, this run's or an earlier one's (agent/search/reflect.py)
        self.reflection = self.archive.latest_reflection(task.source_hash, task.path.name)
        self.since_reflection = 0
        self.normal_forms: dict[str, int] = {}  # normal form -> the first candidate with it (near-duplicates)
        for prior in self.archive.candidates(task_hash=task.source_hash, timed=self.timed):
            if prior.source_sha and prior.verdict != "interrupted" and prior.reason != "harness_error":
                form = normal_form(self.archive.with_source(prior).source or "")
                if form is not None:
                    self.normal_forms.setdefault(form, prior.id)
        # A challenger no duel crowned is not the best, however its own check ranked it; nor the search's pick.
        self.uncrowned = self.archive.uncrowned(task.source_hash) if self.timed else set()
        self.search.held = self.uncrowned
        self.best = best_of(self.elites, self.uncrowned)
        who = (f"{self.provider.name} proposes" + (f"; the tuner polishes the last {self.polish}" if self.polish
                                                   else "")) if self.provider else \
            "the offline tuner proposes (no model configured)"
        gpus = len(set(getattr(self.session, "gpu_ids", ()))) or self.slots
        at_once = f", {self.slots // gpus} candidates checked at once on each" if self.slots > gpus else ""
        where = ("on the CPU: correctness only, through Triton's interpreter at reduced shapes; nothing is timed"
                 if not self.timed else f"on {gpus} GPU(s){at_once}, timed against {', '.join(c.baselines)}")
        resumed = f"resuming run {self.run_id}: {self.issued} of {self.budget} proposals done; " if c.resume else \
            f"run {self.run_id}: "
        self._emit(EventKind.START, f"{resumed}{who}, {where}")
        if self.device == "cpu" and c.gpus > 1:
            self._emit(EventKind.NOTE, f"--gpus {c.gpus} ignored on the CPU: {self.slots} interpreter worker(s) "
                                       "evaluate")

    def _start_kernel(self) -> None:
        self.start: Candidate | None = None
        if self.start_path is None:
            self._emit(EventKind.NOTE, "no seed kernel for this task: the LLM starts from the reference")
            return
        source = self.start_path.read_text(encoding="utf-8", errors="replace")
        flat = flatten(source)  # the model sees and may edit the seed code it imports
        if flat.modules:
            self._emit(EventKind.NOTE, f"the starting kernel includes the seed code it imports "
                                       f"({', '.join(flat.modules)}), so that the model sees every kernel that runs")
        elif flat.problem:
            self._emit(EventKind.NOTE, f"the starting kernel keeps its imports of seed code: {flat.problem}")
        source = flat.source
        sha = sha256(source)
        prior = [c for c in self.archive.candidates(task_hash=self.task.source_hash, timed=self.timed)
                 if c.source_sha == sha and c.verdict != "interrupted"]
        if prior:
            self.start = self.archive.with_source(prior[-1])
            self._emit(EventKind.NOTE, f"starting kernel ({self.start_desc}) already in the archive as "
                                       f"#{self.start.id}: {self.start.verdict}", self.start)
        else:
            pending = Pending("seed", "seed", Selection("fresh"), prompt=f"starting kernel: {self.start_desc}")
            self._admit(pending, source)
            self._emit(EventKind.NOTE, f"checking the starting kernel ({self.start_desc})")
            self._dispatch()
            while self.evals and not self.stop.is_set():
                self._wait()
            if self.stop.is_set():
                self._interrupt("interrupted")
                return
            self.start = self._last_recorded
        if self.start is not None and not self.start.accepted and self.start.verdict == "rejected":
            self.failures.append(self.start)
        if self.provider is None and not self.elites:
            self.stop_reason = (f"the starting kernel was rejected ({self.start.reason if self.start else '?'}); "
                                "the tuner has no verified kernel to tune")

    def _loop(self) -> None:
        while True:
            if self.stop.is_set():
                self._interrupt("interrupted")
                return
            if self.stop_reason is None:
                self._check_limits()
            if self.stop_reason is None:
                self._issue()
            self._dispatch()
            budget_left = self.issued < self.budget and self.stop_reason is None
            dueling = self.bout is not None or bool(self.challengers)
            if not (self.requests or self.ready or self.evals or dueling):
                if not budget_left:
                    break
                if self.stop_reason is None and self._tuner_turn():
                    self.stop_reason = ("the tuner has tried every variant it can make of the verified kernels"
                                        if self.elites else "no verified kernel for the tuner to polish")
                    break
            if self.stop_reason is not None and not self.evals and not self.ready and not dueling:
                break  # pending LLM requests after a limit are abandoned, not waited for
            self._wait()
        if self.stop_reason is None:
            self.stop_reason = "budget spent"

    def _check_limits(self) -> None:
        c = self.config
        if c.max_tokens is not None and self.tokens_in + self.tokens_out >= c.max_tokens:
            self._stopping(f"token budget reached ({self.tokens_in + self.tokens_out} of {c.max_tokens})")
        elif c.max_cost is not None and self.cost >= c.max_cost:
            self._stopping(f"cost budget reached (${self.cost:.4f} of ${c.max_cost:.4f})")
        elif c.time_limit_s is not None and time.monotonic() - self.started >= c.time_limit_s:
            self._stopping(f"time limit reached ({c.time_limit_s:.0f} s)")

    def _stopping(self, reason: str) -> None:
        self.stop_reason = reason
        self._emit(EventKind.STOPPING, reason)

    # ---- evaluating ------------------------------------------------------------------------------------------
    def _dispatch(self) -> None:
        self._start_duel()
        while self.ready and self.free_slots and not self.stop.is_set():
            pending = self.ready.popleft()
            pending.slot = self.free_slots.pop()
            pending.started = time.monotonic()
            incumbent = self.best.timings.candidate_ms if self.best is not None and self.best.timed else None
            if incumbent is not None:  # racing: its timing stops once it cannot beat the best (profiler.stats)
                future = self.session.submit(pending.slot, pending.path, incumbent_ms=incumbent)
            else:
                future = self.session.submit(pending.slot, pending.path)
            self.evals[future] = pending

    def _wait(self) -> None:
        futures = list(self.requests) + list(self.evals)
        if self.bout is not None and self.bout.future is not None:
            futures.append(self.bout.future)
        if not futures:
            return
        done, _ = cf.wait(futures, timeout=0.25, return_when=cf.FIRST_COMPLETED)
        for future in done:
            self._handle(future)

    def _handle(self, future: cf.Future) -> None:
        if self.bout is not None and future is self.bout.future:
            self._take_leg()
            if self.bout.over:
                self._end_duel()
            elif not self.stop.is_set():  # a stop: _interrupt archives the legs so far
                self._next_leg()
            return
        if future in self.requests:
            pending = self.requests.pop(future)
            exc = future.exception()
            if exc is None:
                self.provider_errors = 0
                self.replies += 1
                self._accept_reply(pending, future.result())
                return
            self.provider_errors += 1
            message = str(exc) if isinstance(exc, ProviderError) else f"{type(exc).__name__}: {exc}"
            self._record(self._base(pending, "provider_error", message))
            permanent = isinstance(exc, ProviderError) and not exc.transient  # a key, a model name: ask the user
            # Each failure already spent the provider's retries; one that never answered is not worth many more.
            limit = 2 if self.replies == 0 else MAX_PROVIDER_ERRORS
            if (permanent or self.provider_errors >= limit) and self.stop_reason is None:
                self.provider_failure = message
                self._stopping(message if permanent else
                               f"{self.provider_errors} requests in a row failed; last: {message}")
            return
        pending = self.evals.pop(future)
        self.free_slots.append(pending.slot)
        self.in_flight.discard(pending.sha)
        exc = future.exception()
        if exc is not None:
            log.warning("harness failed on %s", pending.path, exc_info=exc)
            self.session.reset(pending.slot)
            self._record(replace(self._base(pending, "harness_error", f"{type(exc).__name__}: {exc}",
                                            source=pending.source), stage=None))
            self._harness_failed(str(exc))
            return
        self.check_times.append(time.monotonic() - pending.started)
        base = self._base(pending, "ok", "", source=pending.source)
        cand = record_check(base, future.result())
        if self._check_again(pending, cand):
            return
        tuner_feedback(self.tuner, pending, cand)
        self._record(cand)

    # ---- recording -------------------------------------------------------------------------------------------
    def _base(self, p: Pending, reason: str, message: str, *, source: str | None = None) -> Candidate:
        parents = p.selection.parents
        usage = p.reply.usage if p.reply else None
        return Candidate(
            task_path=str(self.task.path), task_hash=self.task.source_hash, origin=p.origin, proposer=p.proposer,
            verdict="accepted" if reason == "ok" else "rejected", reason=reason, run_id=self.run_id, source=source,
            parent_id=parents[0].id if parents else None, parent2_id=parents[1].id if len(parents) > 1 else None,
            niche=niche(source) if source else None, prompt=p.prompt, reply=p.reply.text if p.reply else None,
            stage="propose" if reason in PROPOSE_REASONS else None, message=message,
            input_tokens=usage.input_tokens if usage else 0, output_tokens=usage.output_tokens if usage else 0,
            cost_usd=p.reply.cost_usd if p.reply else None, latency_s=p.reply.latency_s if p.reply else None)

    def _record(self, cand: Candidate) -> None:
        cand = self.archive.add(cand)
        self._last_recorded = cand
        self.history.append(cand)
        if cand.origin != "seed" and cand.reason != "provider_error" and cand.verdict != "interrupted":
            self.since_reflection += 1
            if self.since_reflection >= reflect.REFLECT_EVERY:
                self._reflect()
        if cand.source and cand.reason != "duplicate":
            form = normal_form(cand.source)
            if form is not None:
                if cand.verdict == "interrupted" or cand.reason == "harness_error":
                    self.normal_forms.pop(form, None)  # not evaluated: may come again
                elif self.normal_forms.get(form, -1) == -1:
                    self.normal_forms[form] = cand.id
        if cand.source_sha and cand.verdict != "interrupted" and cand.reason != "harness_error":
            self.known.add(cand.source_sha)
        proposed = cand.origin != "seed"  # the counters are of proposals; the starting kernel is reported apart
        if cand.accepted:
            self.accepted += proposed
            self.verified_llm += cand.origin == "llm"
            self.elites.append(cand)
        elif cand.verdict == "rejected":
            self.rejected += proposed
            if cand.source and cand.stage not in (None, "propose") and cand.origin != "tuner":
                self.failures.append(cand)
        verdict = "not timed" if cand.accepted and not cand.timed else speed(cand) if cand.accepted else cand.reason
        self._emit(EventKind.EVALUATED, f"#{cand.id} {cand.origin} {cand.verdict}: {verdict}", cand)
        if isinstance(self.provider, ModelPool) and cand.origin == "llm":
            improved = cand.accepted and (not self.timed or self.best is None or rank(cand) > rank(self.best))
            self.provider.credit(cand.proposer, improved=improved, cost=cand.cost_usd)
        if cand.accepted and (self.best is None or rank(cand) > rank(self.best)):
            if self.timed and cand.timed and self.best is not None and self.best.timed:
                self.challengers.append(cand)  # crowned only by a duel
            else:
                self._crown(cand)
        target = self.config.target_roofline
        if (target is not None and cand.accepted and cand.timings.pct_roofline is not None
                and cand.timings.pct_roofline >= target and self.stop_reason is None):
            self._stopping(f"target reached: #{cand.id} runs at {cand.timings.pct_roofline:.0f}% of roofline")

    def _reflect(self) -> None:
        """Summarise what has worked for this task (all runs) into the archive; later requests show it."""
        self.since_reflection = 0
        cands = self.archive.candidates(task_hash=self.task.source_hash)
        text = reflect.reflection(cands)
        if text is not None and text != self.reflection:
            self.archive.add_reflection(task_hash=self.task.source_hash, task_name=self.task.path.name,
                                        run_id=self.run_id, text=text, candidates=len(cands))
            self.reflection = text

    def _interrupt(self, reason: str) -> None:
        """Record what finished, mark what did not as interrupted; pending LLM requests are not recorded. A duel
        in flight is archived with the legs it finished (decided, if that was all of them); queued ones unfought."""
        for future in [f for f in list(self.evals) + list(self.requests) if f.done()]:
            self._handle(future)
        if self.bout is not None:
            if self.bout.future is not None and self.bout.future.done():
                self._take_leg()
            self._end_duel()
        while self.challengers:
            assert self.best is not None
            self._archive_duel(duel_mod.queued_unfought(self.challengers.popleft(), self.best, self.run_id))
        for pending in list(self.evals.values()) + list(self.ready):
            cand = self._base(pending, "interrupted", "the run stopped before the harness finished",
                              source=pending.source)
            self._record(replace(cand, verdict="interrupted"))
        self.evals.clear()
        self.ready.clear()
        self.requests.clear()
        if self.stop_reason is None or reason == "interrupted":
            self.stop_reason = reason

    def _close(self) -> None:
        self.session.close()

    def _finish(self) -> RunSummary:
        reason = self.stop_reason or "budget spent"
        if self.since_reflection:
            self._reflect()
        self.archive.finish_run(self.run_id, reason)
        best = self.best
        best_path = None
        if best is not None:
            best = self.archive.with_source(best)
            best_path = self.run_dir / "best.py"
            best_path.write_text(best.source or "", encoding="utf-8")
        not_measured = () if self.timed else (
            "speed: no GPU in this run, so no kernel was timed (no speedup, no torch.compile comparison)",
            "% of roofline: needs a GPU timing",
            "correctness was checked through Triton's CPU interpreter at reduced shapes")
        progress = self._progress()
        self._emit(EventKind.FINISHED, f"run {self.run_id} finished: {reason}")
        return RunSummary(run_id=self.run_id, task_path=str(self.task.path), device=self.device, timed=self.timed,
                          proposer=self.provider.name if self.provider else tuner_mod.NAME, stop_reason=reason,
                          progress=progress, start=self.start if hasattr(self, "start") else None, best=best,
                          best_path=best_path, run_dir=self.run_dir, not_measured=not_measured,
                          notes=tuple(self.notes), provider_failure=self.provider_failure, replies=self.replies,
                          final=self.final, duels=tuple(self.duels))

    def _progress(self) -> Progress:
        elapsed = time.monotonic() - self.started
        new = self.accepted + self.rejected - self.counted_before
        return Progress(per_minute=round(new * 60.0 / elapsed, 2) if new and elapsed > 0 else None,
                        proposals=self.issued, budget=self.budget,
                        in_flight=len(self.requests) + len(self.ready) + len(self.evals) + self._dueling(),
                        accepted=self.accepted, rejected=self.rejected, input_tokens=self.tokens_in,
                        output_tokens=self.tokens_out,
                        cost_usd=self.cost if self.priced else None, requests=self.llm_requests,
                        verified_llm=self.verified_llm, elapsed_s=time.monotonic() - self.started,
                        check_s=sum(self.check_times) / len(self.check_times) if self.check_times else None,
                        proposer="tuner" if self._tuner_turn() else (self.provider.name if self.provider else ""),
                        best=self.best)

    def _emit(self, kind: EventKind, message: str, cand: Candidate | None = None) -> None:
        log.info("%s", message)
        self.on_event(Event(kind, message, self._progress(), cand))


def _device(device: str) -> str:
    from sandbox.device import resolve_device
    try:
        return resolve_device(device)
    except ValueError as exc:
        raise LoopError(str(exc)) from None

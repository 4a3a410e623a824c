"""The coordinator's proposing half: when the tuner or the LLM is asked for the next kernel, and what becomes of
its reply.

`Issuing` is a part of the search loop's coordinator (agent/search/loop.py), kept apart because it is one job: keep
requests in flight within `--concurrency`, compose each from every verdict known now (agent/search/proposing.py),
and take a reply in (cut off, SEARCH/REPLACE edits, a whole file, a duplicate) until it is a candidate waiting for a
slot. It reads and writes the coordinator's state; it runs on the coordinating thread only.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

from agent.archive.records import Candidate, sha256
from agent.llm import diffs
from agent.llm.chat import Reply
from agent.llm.extract import NoCode, extract_code, normal_form, outside_reasoning
from agent.llm.pool import ModelPool
from agent.search.elites import MAX_FIXES, Selection
from agent.search.executors import spawn as _spawn
from agent.search.flatten import flatten
from agent.search.proposing import Pending, llm_messages, messages_text, system_for, tuner_proposal
from agent.search.runs import EventKind
from sandbox.records import GPU_FULL, GPU_FULL_HARNESS, GPU_FULL_SHARED

FEWER_CHECKS = "the GPU's memory was full with"  # the note that a run goes on with one check fewer at once
MORE_CHECKS = "the GPU's memory was not full in"  # the note that a run takes a check it gave up back
MAX_HARNESS_ERRORS = 3  # checks in a row the harness itself failed (raised, or a final harness_error) that stop a run
REGAIN_AFTER = 2  # verdicts a check at once, none of them for a full GPU, before a check given up is tried again
TRUNCATED = ("length", "max_tokens")  # finish reasons of a reply cut off at the output limit (OpenAI, Anthropic)


@dataclass
class MemoryCuts:
    """The checks at once a run gave up because the GPU's memory was full, and what decides taking one back."""
    given_up: list[int] = field(default_factory=list)  # the slots given up, the latest last
    full_at: Counter[int] = field(default_factory=Counter)  # checks at once -> how often the GPU was full at it
    clear: int = 0  # verdicts since the last change that did not end for a full GPU


class Issuing:
    """Asking the tuner or the LLM for proposals and admitting their replies (a part of the loop's coordinator)."""

    def _tuner_turn(self) -> bool:
        return self.provider is None or self.issued >= self.budget - self.polish

    def _issue(self) -> None:
        while self.issued < self.budget and self.stop_reason is None:
            if self._tuner_turn():
                if len(self.ready) + len(self.evals) >= self.slots:
                    return  # keep the tuner just ahead of evaluation, so it builds on fresh results
                if any(p.origin == "llm" for p in [*self.requests.values(), *self.ready, *self.evals.values()]):
                    return  # the polish starts once the LLM's last kernels have their verdicts: it tunes those too
                if self.provider is not None and self.issued == self.budget - self.polish:
                    self._emit(EventKind.NOTE, f"polish: the tuner proposes the last {self.polish}")
                proposal = tuner_proposal(self.search, self.tuner, self.elites, self.exhausted,
                                          self.known | self.in_flight)
                if proposal is None:
                    return
                self.issued += 1
                self._accept_reply(*proposal)
            else:
                if len(self._outstanding()) >= self.config.concurrency or not self._request():
                    return

    def _check_again(self, pending: Pending, cand: Candidate) -> bool:
        """A candidate whose check the harness itself failed (out of GPU memory beside the other checks: a verdict
        of harness_error, which says nothing about the kernel) waits for the next slot, once; True when it does.
        Where the GPU's memory was full, the run keeps one check fewer at once (at least one): the memory estimate
        that set the count (executors.checks_that_fit) fell short at this task, or a passing peak met the others.
        Where that rests on the candidate's own account of its memory (GPU_FULL_SHARED), only once its retry ends
        so too: a forged account then costs a slot per candidate that forges it twice, never one per forgery. The
        slot comes back (`_take_back`) once the checks left have passed REGAIN_AFTER verdicts each without it."""
        if cand.reason != "harness_error":
            self.harness_errors = 0
            self._take_back()
            return False
        full = _gpu_full(cand)
        trusted = full == GPU_FULL_HARNESS or (full == GPU_FULL_SHARED and pending.retried)
        if trusted and self.slots > 1 and pending.slot in self.free_slots:
            self.free_slots.remove(pending.slot)  # one check fewer at once from now on, a retry's included
            self.memory.given_up.append(pending.slot)
            self.memory.full_at[self.slots] += 1
            self.memory.clear = 0
            self.slots -= 1
            again = ("" if self.memory.full_at[self.slots + 1] > 1 else
                     f", {self.slots + 1} again after {REGAIN_AFTER * self.slots} verdicts without a full GPU")
            self._emit(EventKind.NOTE, f"{FEWER_CHECKS} {self.slots + 1} checks at once: {self.slots} at a time "
                                       f"from now on{again}")
        if pending.retried or self.stop_reason is not None:
            self._harness_failed(cand.message or "")
            return False
        pending.retried = True
        self.in_flight.add(pending.sha)
        self.ready.appendleft(pending)
        return True

    def _harness_failed(self, last: str) -> None:
        """One more check in a row that the harness itself failed; the run stops at MAX_HARNESS_ERRORS of them (a
        machine whose Triton cannot run the kernels, a GPU taken by another process), saying why."""
        self.harness_errors += 1
        if self.harness_errors >= MAX_HARNESS_ERRORS and self.stop_reason is None:
            self._stopping(f"the harness failed {self.harness_errors} times in a row; last: {last}")

    def _take_back(self) -> None:
        """One more verdict that did not end for a full GPU; after REGAIN_AFTER of them for each check at once, the
        check given up last comes back (its harness stayed warm), unless the GPU was full twice at that count: a
        passing peak (one large candidate, a duel beside the checks) costs a slot for a while, a count that does
        not fit costs it for the rest of the run."""
        memory = self.memory
        memory.clear += 1
        if (not memory.given_up or memory.clear < REGAIN_AFTER * self.slots or memory.full_at[self.slots + 1] > 1
                or self.stop_reason is not None):
            return
        self.free_slots.append(memory.given_up.pop())
        self.slots += 1
        self._emit(EventKind.NOTE, f"{MORE_CHECKS} {memory.clear} verdicts at {self.slots - 1} checks at once: "
                                   f"{self.slots} at a time again")
        memory.clear = 0

    def _outstanding(self) -> list[Pending]:
        """The LLM's proposals whose outcome is not known yet: requests in flight and candidates still waiting for
        or in their check. `--concurrency` bounds these, so a request is never sent while more than that many
        verdicts it could have learnt from are still on their way."""
        return [p for p in [*self.requests.values(), *self.ready, *self.evals.values()] if p.origin == "llm"]

    def _request(self) -> bool:
        """Compose a request from every verdict known now and send it; False (nothing sent) when the prompt is one
        already waiting for an outcome `samples` times: the next verdict will change it, so wait for that."""
        assert self.provider is not None
        fixed = {c.parent_id for c in self.history if c.accepted}  # a failure with a verified fix needs no other
        sel = self._retry() or self.search.select_for_llm(self.elites, [f for f in self.failures if f.id not in fixed])
        best = self.archive.with_source(self.best) if self.best is not None else None
        if self.system is None:
            self.system = self._system_prompt()
        messages = llm_messages(self.task, sel, self.elites, timed=self.timed, history=self.history, best=best,
                                max_output_tokens=self.config.reply_max_tokens, system=self.system,
                                reflection=self.reflection)
        prompt = messages_text(messages)
        if sum(p.prompt == prompt for p in self._outstanding()) >= max(1, self.config.samples):
            if sel.kind == "fix":
                self.search.fixes[sel.parents[0].id] -= 1  # not attempted after all
            return False
        provider, c = self.provider, self.config
        if isinstance(provider, ModelPool):
            provider = provider.pick()  # several models: weighted by verified improvement per dollar
        pending = Pending("llm", provider.name, sel, prompt=prompt)
        future = _spawn(lambda: provider.complete(messages, max_tokens=c.reply_max_tokens, temperature=c.temperature))
        self.requests[future] = pending
        self.issued += 1
        self.llm_requests += 1
        return True

    def _retry(self) -> Selection | None:
        """The kernel a reply whose edits did not apply (or that was cut off) was asked about, once: the next request
        from it lists that attempt with the reason, while it is fresh."""
        for c in reversed(self.history):
            if c.origin != "llm" or c.id in self.retried:
                continue
            if c.reason not in ("edit_failed", "truncated") or c.parent_id is None:
                return None
            self.retried.add(c.id)
            parent = next((e for e in [*self.elites, *self.failures] if e.id == c.parent_id), None)
            if parent is None:
                return None
            if parent.accepted:
                return Selection("improve", (parent,))
            if self.search.fixes[parent.id] >= MAX_FIXES + 1:
                return None
            self.search.fixes[parent.id] += 1
            return Selection("fix", (parent,))
        return None

    def _system_prompt(self) -> str:
        """The run's system prompt (agent/search/proposing.py's system_for). The versions and the GPU come from the
        harness's checks (the coordinator never touches the GPU itself)."""
        checked = [c for c in [self.start, *reversed(self.elites)] if c is not None and c.env]
        env = {k: v for k, v in checked[0].env.items() if v is not None} if checked else {}
        ceilings = _cached_ceilings(env) if self.timed else None
        return system_for(self.task, timed=self.timed, env=env, ceilings=ceilings, archive=self.archive,
                          own_seed=self.start_path, max_output_tokens=self.config.reply_max_tokens)

    def _accept_reply(self, pending: Pending, reply: Reply) -> None:
        pending.reply = reply
        self.tokens_in += reply.usage.input_tokens
        self.tokens_out += reply.usage.output_tokens
        self.cost += reply.cost_usd or 0.0
        if reply.cost_usd is None:
            self.priced = False  # unknown, never shown as $0
        if (reply.finish_reason or "").lower() in TRUNCATED:
            limit = self.config.reply_max_tokens
            self._record(self._base(pending, "truncated", f"the reply was cut off at the output limit ({limit} tokens, "
                                                          f"finish_reason {reply.finish_reason}), so nothing of it "
                                                          "was checked; answer with SEARCH/REPLACE edits or a "
                                                          "shorter file"))
            return
        if pending.origin == "tuner" and pending.source is not None:
            source = pending.source  # nothing to extract, and a flattened file's literals changed flatten to it
        else:
            source = self._proposed_source(pending, reply.text)
            if source is None:
                return
            source = flatten(source).source
        sha = sha256(source)
        if sha in self.known or sha in self.in_flight:
            self._record(self._base(pending, "duplicate", "the same file was already evaluated for this task",
                                    source=source))
            return
        form = normal_form(source)
        if form is not None and form in self.normal_forms:
            first = self.normal_forms[form]
            same = f"#{first}, already evaluated" if first >= 0 else "a candidate being checked now"
            self._record(self._base(pending, "duplicate", f"the same code as {same} (up to comments and formatting)",
                                    source=source))
            return
        self._admit(pending, source)

    def _proposed_source(self, pending: Pending, text: str) -> str | None:
        """The file a reply proposes: its SEARCH/REPLACE edits applied to the kernel the request showed, else the
        file it contains; None when it has neither (recorded, and shown to the model on its next turn)."""
        text = outside_reasoning(text) if diffs.has_edits(outside_reasoning(text)) else text
        if diffs.has_edits(text):
            parent = pending.selection.parent
            base = self.archive.with_source(parent).source if parent is not None else None
            if not base:
                self._record(self._base(pending, "edit_failed", "the reply has SEARCH/REPLACE edits but the request "
                                                                "showed no kernel to edit; write the whole file"))
                return None
            try:
                return diffs.apply_edits(base, diffs.parse_edits(text))
            except diffs.EditError as exc:
                self._record(self._base(pending, "edit_failed", str(exc)))
                return None
        code = extract_code(text)
        if isinstance(code, NoCode):
            self._record(self._base(pending, "no_code", code.reason))
            return None
        return code.source

    def _admit(self, pending: Pending, source: str) -> None:
        pending.source, pending.sha = source, sha256(source)
        pending.path = self.run_dir / "candidates" / f"{pending.sha[:16]}.py"
        pending.path.write_text(source, encoding="utf-8")
        self.in_flight.add(pending.sha)
        form = normal_form(source)
        if form is not None:
            self.normal_forms.setdefault(form, -1)  # in flight; the record's id replaces it
        self.ready.append(pending)


def _cached_ceilings(env: dict) -> dict | None:
    """The ceilings `crucible bench --ceilings` cached for the GPU `env` describes; None when not measured."""
    from profiler.ceilings import CACHE_FILE, cache_dir
    from profiler.env import device_key

    if not isinstance(env.get("gpu"), dict):
        return None  # no GPU described: no key to look the ceilings up by
    try:
        data = json.loads((cache_dir() / CACHE_FILE).read_text())
    except (OSError, ValueError):
        return None
    hit = data.get(device_key(env)) if isinstance(data, dict) else None
    return hit if isinstance(hit, dict) and hit.get("copy_gbps") else None


def _gpu_full(cand: Candidate) -> str | None:
    """How the check's end for a full GPU was established (sandbox.records.GPU_FULL on its last stage); None where
    it did not end so."""
    stages = (cand.diagnostics or {}).get("stages") or [{}]
    return (stages[-1].get("details") or {}).get(GPU_FULL)

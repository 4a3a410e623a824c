"""Prompts from the templates in agent/llm/prompts/, and the harness's verdict written out for a model to act on.

Templates are `string.Template` text (`$field`, `${field}`, `$$` for a dollar sign). A line `@include NAME` pastes
agent/llm/prompts/NAME.md in its place, so the shared parts are written once. `render` fails loudly on a missing or an
unknown field rather than sending a prompt with a hole in it.
"""
from __future__ import annotations

import difflib
import re
import string
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

from agent.llm.chat import Message

PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"
EXAMPLES_DIR = PROMPTS_DIR / "examples"
_INCLUDE = re.compile(r"^@include[ \t]+([\w-]+)[ \t]*$", re.M)
MAX_ERROR_CHARS = 4000  # of a traceback or compiler message: the end is where the cause is
CONTEXT_LINES = 3  # source lines shown either side of the line an error points at

DEFAULT_GOAL = ("Make it faster while keeping it exactly as correct. Use the timings and the roofline above: if the "
                "kernel is far from the roofline, find what stops it (extra passes over memory, too few programs "
                "for 132 SMs, narrow loads, spills) and change that.")


class PromptError(Exception):
    """A template is missing, includes itself, or was rendered with missing or unknown fields."""


@lru_cache(maxsize=None)
def _text(name: str, _seen: tuple[str, ...] = ()) -> str:
    if name in _seen:
        raise PromptError(f"prompt template {name!r} includes itself ({' -> '.join(_seen + (name,))})")
    path = PROMPTS_DIR / f"{name}.md"
    if not path.is_file():
        raise PromptError(f"no prompt template {path}")
    text = path.read_text(encoding="utf-8")
    return _INCLUDE.sub(lambda m: _text(m.group(1), _seen + (name,)).rstrip("\n"), text)


def fields_of(name: str) -> set[str]:
    """The fields template `name` needs."""
    found = set()
    for m in string.Template.pattern.finditer(_text(name)):
        if m.group("invalid") is not None:
            line = _text(name)[:m.start()].count("\n") + 1
            raise PromptError(f"prompt template {name!r} has a stray '$' at line {line}; write $$ for a dollar sign")
        if m.group("named") or m.group("braced"):
            found.add(m.group("named") or m.group("braced"))
    return found


def render(name: str, **fields: Any) -> str:
    """Template `name` with every field filled; PromptError when one is missing or not in the template."""
    needed = fields_of(name)
    missing, unknown = needed - fields.keys(), fields.keys() - needed
    if missing or unknown:
        parts = ([f"missing {sorted(missing)}"] if missing else []) + ([f"unknown {sorted(unknown)}"] if unknown else [])
        raise PromptError(f"prompt template {name!r}: {' and '.join(parts)} fields")
    text = string.Template(_text(name)).substitute({k: str(v) for k, v in fields.items()})
    return "\n".join(line.rstrip() for line in text.strip().split("\n")) + "\n"


def example_source(name: str = "rmsnorm_fwd") -> str:
    return (EXAMPLES_DIR / f"{name}.py").read_text(encoding="utf-8").strip()


# ---- the conversation the loop sends --------------------------------------------------------------------------------
def system_prompt(*, gpu: str = "h200", allow_torch_compute: bool = False, max_output_tokens: int = 8192,
                  gpu_facts: str | None = None, example: tuple[str, str] | None = None) -> str:
    """The rules (from the harness's own lists), the answer formats, the GPU's facts and an example.

    `gpu_facts` replaces the template agent/llm/prompts/gpu_{gpu}.md where the loop measured the facts; `example` is
    (what it is, its source), by default the RMSNorm forward kept with the prompts.
    """
    from sandbox.allowlist import ALLOWED_IMPORTS, FORBIDDEN_NAMES

    torch_compute = ("This task allows PyTorch compute besides your kernels, but the speed of your own kernels is "
                     "what is being measured." if allow_torch_compute else "")
    rules = render("_rules", allowed_imports=", ".join(sorted(ALLOWED_IMPORTS)),
                   forbidden_names=", ".join(sorted(FORBIDDEN_NAMES)), torch_compute=torch_compute).strip()
    title, source = example or ("a different reference: RMSNorm forward", example_source())
    example_text = f"# An example of a valid file ({title})\n```python\n{source.strip()}\n```"
    facts = gpu_facts if gpu_facts is not None else render(f"gpu_{gpu}").strip()
    return render("system", rules=rules, gpu_facts=facts.strip(), example=example_text,
                  max_output_tokens=max_output_tokens)


def propose_messages(*, task_name: str, task_source: str, parent_source: str, parent_diagnostics: str,
                     elites: Sequence[tuple[str, str]] = (), goal: str = DEFAULT_GOAL, attempts: str = "None yet.",
                     reflection: str = "Nothing yet.", system: str | None = None, **system_kw: Any) -> list[Message]:
    """Improve `parent_source`; `elites` are (summary, source) pairs of other verified kernels, best first;
    `attempts` is what was tried from this kernel so far and how it went."""
    elite_text = "\n".join(render("_elite", rank=i + 1, summary=summary, source=code_block(src, parent_source))
                           for i, (summary, src) in enumerate(elites)) or "None yet."
    user = render("propose", task_name=task_name, task_source=task_source.strip(), parent_source=parent_source.strip(),
                  parent_diagnostics=parent_diagnostics.strip(), elites=elite_text.strip(), goal=goal,
                  attempts=attempts.strip() or "None yet.", reflection=reflection.strip() or "Nothing yet.")
    return [Message(role="system", content=system or system_prompt(**system_kw)), Message(role="user", content=user)]


def fix_messages(*, task_name: str, task_source: str, broken_source: str, diagnostics: str,
                 attempts: str = "None yet.", best: tuple[str, str] | None = None, reflection: str = "Nothing yet.",
                 system: str | None = None, **system_kw: Any) -> list[Message]:
    """Repair `broken_source`; `best` is (summary, source) of the best verified kernel, when there is one."""
    best_text = f"{best[0]}\n{code_block(best[1], broken_source)}" if best else "None verified yet."
    user = render("fix", task_name=task_name, task_source=task_source.strip(), broken_source=broken_source.strip(),
                  diagnostics=diagnostics.strip(), attempts=attempts.strip() or "None yet.", best=best_text,
                  reflection=reflection.strip() or "Nothing yet.")
    return [Message(role="system", content=system or system_prompt(**system_kw)), Message(role="user", content=user)]


def crossover_messages(*, task_name: str, task_source: str, source_a: str, diagnostics_a: str, source_b: str,
                       diagnostics_b: str, system: str | None = None, **system_kw: Any) -> list[Message]:
    user = render("crossover", task_name=task_name, task_source=task_source.strip(), source_a=source_a.strip(),
                  diagnostics_a=diagnostics_a.strip(), source_b=code_block(source_b, source_a),
                  diagnostics_b=diagnostics_b.strip())
    return [Message(role="system", content=system or system_prompt(**system_kw)), Message(role="user", content=user)]


KERNEL_STATS = (("n_regs", "registers/thread"), ("registers", "registers/thread"), ("n_spills", "spills"),
                ("spills", "spills"), ("shared", "bytes shared memory"), ("shared_bytes", "bytes shared memory"),
                ("num_warps", "warps"), ("num_stages", "stages"))  # (key in a kernel's stats, how it is said)
MAX_DIFF_SHARE = 0.5  # a kernel is shown as a diff when the diff is at most this share of its full text


def code_block(source: str, base: str | None = None) -> str:
    """`source` in a python block; where a `base` the request already shows in full is close to it, as a unified
    diff from that base instead (a second near-copy of a long kernel costs every request its tokens)."""
    source = source.strip()
    if base is not None and base.strip() == source:
        return "(the same file as the kernel shown above)"
    if base:
        diff = "\n".join(difflib.unified_diff(base.strip().split("\n"), source.split("\n"), "the kernel above",
                                              "this kernel", lineterm="", n=2))
        if len(diff) <= MAX_DIFF_SHARE * len(source):
            return f"As a diff from the kernel shown above:\n```diff\n{diff}\n```"
    return f"```python\n{source}\n```"


# ---- the verdict, written out -----------------------------------------------------------------------------------
def describe_result(result: Any, source: str | None = None) -> str:
    """What the harness found, for the model: failing stage and reason, mismatch report, the error with the source
    lines it points at, times against each baseline, % of roofline, registers and spills per kernel.

    `result` is a sandbox.records.CheckResult or its `to_dict()` (as the archive stores it); `source` is the
    candidate's text, used to show the lines an error points at.
    """
    r = result.to_dict() if hasattr(result, "to_dict") else dict(result)
    lines: list[str] = []
    verdict, stage, reason = r.get("verdict"), r.get("stage"), r.get("reason")
    if verdict == "accepted":
        lines.append("Accepted: it passed every check (" + ", ".join(s.get("stage", "?") for s in r.get("stages", []))
                     + ").")
    else:
        lines.append(f"Rejected at the {stage} stage ({reason}): {r.get('message', '').strip()}")
    for st in r.get("stages", []):
        if st.get("passed"):
            continue
        if st.get("message") and st.get("message") != r.get("message"):
            lines.append(f"{st.get('stage')}: {st['message'].strip()}")
        if st.get("mismatch"):
            lines.append(_describe_mismatch(st["mismatch"]))
        if st.get("error"):
            lines.append(_describe_error(st["error"], source, r.get("candidate"), already=r.get("message", "")))
    if not r.get("timed") or not r.get("timing"):
        if verdict == "accepted":
            lines.append("Not timed (no GPU in this run, or timing disabled): its speed is unknown.")
    else:
        lines.extend(_describe_timing(r["timing"]))
    return "\n".join(line for line in lines if line)


def _describe_mismatch(m: dict[str, Any]) -> str:
    from sandbox.records import Mismatch

    fields = {k: (tuple(v) if isinstance(v, list) else v) for k, v in m.items()}
    for key in ("expected", "got", "max_abs_err", "rel_l2_err", "rel_l2_bound"):
        if fields.get(key) is None:
            fields[key] = float("nan")  # NaN becomes null in JSON
    return Mismatch(**fields).describe()


def _describe_error(err: dict[str, Any], source: str | None, candidate: str | None, already: str = "") -> str:
    kind, message = err.get("type", "Error"), (err.get("message") or "").strip()
    head = f"{kind}: {message}"
    out = [] if head == already.strip() else [head[-MAX_ERROR_CHARS:]]
    root, path = _error_lines(err, candidate)
    in_kernel = _compile_error_line(message, source, root) if source else None
    if in_kernel:
        kernel, line = in_kernel
        out.append(f"Triton could not compile `{kernel}`; at line {line} of your file:\n{numbered(source, line)}")
    if root and source:
        out.append(f"{'Launched from' if in_kernel else 'At'} line {root} of your file:\n{numbered(source, root)}")
    if len(path) > 1:
        out.append("Call path in your file: " + " -> ".join(f"line {n} ({fn})" for n, fn in path))
    tb = (err.get("traceback") or "").strip()
    if tb and not root and message not in tb[-MAX_ERROR_CHARS:]:
        out.append("Traceback (end):\n" + tb[-MAX_ERROR_CHARS:])
    return "\n".join(out)


def _error_lines(err: dict[str, Any], candidate: str | None) -> tuple[int | None, list[tuple[int, str]]]:
    """The candidate's line where the error arose, and the call path through the candidate's file to it.

    In a chained traceback the first section is the original exception (e.g. inside a kernel the interpreter ran),
    the last one has the full call path from the harness.
    """
    tb = err.get("traceback") or ""
    name = Path(candidate).name if candidate else None
    sections = [[(int(n), fn) for f, n, fn in re.findall(r'File "([^"]+)", line (\d+), in (\S+)', sec)
                 if name and Path(f).name == name]
                for sec in tb.split("Traceback (most recent call last):")]
    sections = [sec for sec in sections if sec]
    if sections:
        root = sections[0][-1]
        path = sections[-1] + ([root] if root not in sections[-1] else [])
        return root[0], path
    m = re.search(r"\bline (\d+)", err.get("message") or "")
    return (int(m.group(1)) if m else None), []


def _compile_error_line(message: str, source: str, root: int | None) -> tuple[str, int] | None:
    """Triton's CompilationError says "at L:C:" counting from the kernel's `def` line; map it to the file's line,
    using the kernel launched at the line the traceback points at."""
    m = re.search(r"\bat (\d+):(\d+):", message)
    lines = source.split("\n")
    if not m or not root or root > len(lines):
        return None
    launched = re.findall(r"(\w+)\s*\[", lines[root - 1])
    for kernel in launched:
        d = re.search(rf"^[ \t]*def[ \t]+{re.escape(kernel)}[ \t]*\(", source, re.M)
        if d:
            line = source[:d.start()].count("\n") + int(m.group(1))
            if line <= len(lines):
                return kernel, line
    return None


def numbered(source: str, line: int, context: int = CONTEXT_LINES) -> str:
    """Source lines around `line`, numbered, the line itself marked with '>'."""
    lines = source.split("\n")
    lo, hi = max(1, line - context), min(len(lines), line + context)
    return "\n".join(f"{'>' if i == line else ' '} {i:4d} | {lines[i - 1]}" for i in range(lo, hi + 1))


def _describe_timing(t: dict[str, Any]) -> list[str]:
    out = []
    ms = t.get("candidate_ms")
    if ms is not None:
        out.append(f"Time: {ms:.4g} ms per call (median).")
    for name, b in (t.get("baselines") or {}).items():
        if not isinstance(b, dict) or b.get("ms") is None:
            continue
        text = f"  vs {name}: {b['ms']:.4g} ms"
        if b.get("speedup") is not None:
            text += f", speedup {b['speedup']:.3g}x"
            if b.get("ci_low") is not None and b.get("ci_high") is not None:
                text += f" (95% CI {b['ci_low']:.3g}-{b['ci_high']:.3g})"
            if b.get("significant") is False:
                text += ", not significant"
        out.append(text)
    roof = t.get("roofline") or {}
    if roof.get("pct_of_roofline") is not None:
        bound = roof.get("bound", "?")
        rate = (f"{roof['gbps']:.0f} GB/s" if bound == "memory" and roof.get("gbps") is not None else
                f"{roof['tflops']:.1f} TFLOP/s" if roof.get("tflops") is not None else "")
        out.append(f"Roofline: {roof['pct_of_roofline']:.0f}% of the {bound}-bound limit" + (f" ({rate})." if rate
                                                                                                 else "."))
    for k in t.get("kernels") or []:
        if not isinstance(k, dict):
            continue
        stats = [f"{k[key]} {label}" for key, label in KERNEL_STATS if k.get(key) is not None]
        if isinstance(k.get("ms"), (int, float)):
            stats.insert(0, f"{k['ms']:.4g} ms")
        counters = k.get("counters") or k.get("ncu")
        if isinstance(counters, dict):  # hardware counters, where ncu or proton could read them
            stats.extend(f"{name} {value}" for name, value in sorted(counters.items())
                         if isinstance(value, (int, float, str)))
        if stats:
            out.append(f"Kernel {k.get('name', '?')}: " + ", ".join(stats) + ".")
    return out

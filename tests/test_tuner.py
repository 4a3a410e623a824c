"""The offline tuner finds the knobs of real kernels and proposes valid, distinct, reproducible variants."""
import ast
from pathlib import Path

from agent.archive.records import sha256
from agent.llm.extract import ExtractedCode, extract_code
from agent.search.elites import niche
from agent.search.tuner import Tuner, find_knobs, skeleton

ROOT = Path(__file__).resolve().parent.parent
RMSNORM = (ROOT / "seeds" / "rmsnorm.py").read_text()

# The way LLMs write kernels: a module constant, a literal num_warps, a heuristic, an autotuned kernel.
LLM_KERNEL = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl

BLOCK_SIZE = 1024  # élément par programme


@triton.jit
def _add_kernel(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + offs, tl.load(X + offs, mask=offs < n) * 2, mask=offs < n)


@triton.autotune(configs=[triton.Config({"BLOCK_M": 64}, num_warps=4)], key=["n"])
@triton.jit
def _tuned_kernel(X, n, BLOCK_M: tl.constexpr):
    pass


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        n = x.numel()
        num_warps = 8 if n > 4096 else 4
        _add_kernel[(triton.cdiv(n, BLOCK_SIZE),)](x, y, n, BLOCK=BLOCK_SIZE, num_warps=num_warps)
        return y
'''


def knob_table(source):
    return [(k.key, k.kind, k.text) for k in find_knobs(source)]


def test_finds_the_knobs_of_an_llm_style_kernel():
    table = knob_table(LLM_KERNEL)
    assert ("BLOCK_SIZE#1", "block", "1024") in table
    assert ("BLOCK_M#1", "block", "64") in table  # a triton.Config dict entry
    assert ("num_warps#1", "warps", "4") in table  # triton.Config(num_warps=4)
    # the heuristic: both warps literals, and the threshold (scaled as a count, not as warps)
    assert ("num_warps#2", "warps", "8") in table and ("num_warps#4", "warps", "4") in table
    assert ("num_warps#3", "count", "4096") in table
    # the launch's num_warps=<expression> can be pinned; num_stages is absent and can be added
    assert ("_add_kernel[].num_warps#1", "option", "num_warps") in table
    assert ("_add_kernel[].num_stages#1", "option", "") in table
    # nothing inside the kernel body (the literal 2 there is maths), no launch options on the autotuned kernel
    assert not any(text == "2" for _, _, text in table)
    assert not any(key.startswith("_tuned_kernel[]") for key, _, _ in table)


def test_a_launch_with_a_keyword_splat_gets_no_absent_option():
    """`kernel[grid](..., **cfg)`: the dict may hold num_warps already, and an added `num_warps=4` then failed the
    launch ("got multiple values for keyword argument 'num_warps'": the attention seed's backward, on the H200)."""
    source = LLM_KERNEL.replace("BLOCK=BLOCK_SIZE, num_warps=num_warps)", "**{'BLOCK': BLOCK_SIZE, 'num_warps': 4})")
    assert source != LLM_KERNEL
    table = knob_table(source)
    assert not any(key.startswith("_add_kernel[]") for key, _, _ in table)
    assert ("_add_kernel[].num_stages#1", "option", "") in knob_table(LLM_KERNEL)


def test_finds_the_knobs_of_a_seed_kernel():
    keys = {k.key for k in find_knobs(RMSNORM)}
    assert {"fwd_config()#1", "bwd_config()#1", "bwd_config()#2", "_rmsnorm_fwd_kernel[].num_warps#1",
            "_rmsnorm_bwd_kernel[].num_warps#1", "_rmsnorm_fwd_kernel[].num_stages#1"} <= keys


def test_mutations_are_valid_distinct_and_new():
    tuner = Tuner(seed=3)
    known = {sha256(RMSNORM)}
    variants = []
    for _ in range(12):
        prop = tuner.mutate(RMSNORM, known)
        assert prop is not None
        assert sha256(prop.source) not in known
        ast.parse(prop.source)  # still Python
        assert skeleton(prop.source) == skeleton(RMSNORM)  # only knob values changed: same lineage
        changed = [line for a, b in zip(RMSNORM.splitlines(), prop.source.splitlines()) if a != b
                   for line in [b]]
        assert 1 <= len(changed) <= 2, prop.description
        known.add(sha256(prop.source))
        variants.append(prop.source)
    assert len(set(variants)) == 12
    # returned as a provider would: the loop extracts exactly this source from the reply text
    extracted = extract_code(prop.reply.text)
    assert isinstance(extracted, ExtractedCode) and extracted.source.rstrip() == prop.source.rstrip()
    assert prop.reply.provider == "tuner" and prop.reply.cost_usd == 0.0 and "tuner mutation" in prop.reply.text


def test_same_seed_same_proposals():
    def run(seed):
        tuner, known, out = Tuner(seed), set(), []
        for _ in range(5):
            prop = tuner.mutate(LLM_KERNEL, known)
            known.add(sha256(prop.source))
            out.append(prop.description)
        return out
    assert run(7) == run(7)
    assert run(7) != run(8)


def test_exhausting_a_small_space_returns_none():
    src = "import triton\nX = 1\n\ndef launch_config():\n    return 2\n"
    knobs = find_knobs(src)
    assert [(k.key, k.value) for k in knobs] == [("launch_config()#1", 2)]
    tuner, known = Tuner(0), {sha256(src)}
    seen = []
    while (prop := tuner.mutate(src, known)) is not None:
        known.add(sha256(prop.source))
        seen.append(ast.literal_eval(prop.source.split("return ")[1].strip()))
    assert sorted(seen) == [1, 4, 8]  # 2 -> x2, /2, x4 (2/4 rounds to 0: below 1, never proposed)
    assert tuner.mutate("no knobs = here\n", set()) is None
    assert tuner.mutate("def broken(:\n", set()) is None


def test_crossover_combines_two_elites_of_one_lineage():
    a = LLM_KERNEL
    b = a.replace("BLOCK_SIZE = 1024", "BLOCK_SIZE = 256").replace("8 if n > 4096", "16 if n > 4096")
    child = Tuner(1).crossover(a, b, {sha256(a), sha256(b)})
    assert child is not None and "crossover" in child.description
    assert child.source not in (a, b)
    assert {("BLOCK_SIZE = 256" in child.source), ("16 if n > 4096" in child.source)} == {True, False}
    # another design (different code around the knobs) is not crossed
    other = a.replace("* 2, mask", "* 3, mask")
    assert Tuner(1).crossover(a, other.replace("1024", "256"), set()) is None
    # parents differing at one knob only cannot give a child different from both
    assert Tuner(1).crossover(a, a.replace("1024", "512", 1), set()) is None


def test_niche_reads_kernel_features():
    assert niche(LLM_KERNEL) == "elementwise-grid-tile:k2-w8-b1024-s?"
    # the algorithm, not only the launch settings: a persistent grid is another niche
    persistent = LLM_KERNEL.replace("tl.program_id(0)", "tl.program_id(0) + tl.num_programs(0) * 0")
    assert niche(persistent).startswith("elementwise-persistent-tile:")
    assert niche("def broken(:") == "unparsed"


def test_options_of_a_helper_imported_from_the_repository():
    """A thin seed calls seeds.rmsnorm.rmsnorm_bwd(...): its tuning keywords are read from that file and pinned."""
    thin = (ROOT / "seeds" / "rmsnorm_bwd.py").read_text()
    knobs = {k.key: k for k in find_knobs(thin)}
    assert set(knobs) == {"rmsnorm_bwd().programs_per_sm#1", "rmsnorm_bwd().rows#1", "rmsnorm_bwd().num_warps#1"}
    assert knobs["rmsnorm_bwd().num_warps#1"].choices() == [2, 4, 8, 16, 32]
    tuner, known = Tuner(0), {sha256(thin)}
    for _ in range(6):
        prop = tuner.mutate(thin, known)
        known.add(sha256(prop.source))
        call = next(n for n in ast.walk(ast.parse(prop.source))
                    if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "rmsnorm_bwd")
        names = [kw.arg for kw in call.keywords]
        assert names and len(names) == len(set(names)) and set(names) <= {"programs_per_sm", "rows", "num_warps"}
        assert skeleton(prop.source) == skeleton(thin)
        # a pinned option is tuned from its value next time
        again = {k.key: k for k in find_knobs(prop.source)}
        assert set(again) == set(knobs)
    # a name imported from outside the repository is not a helper
    assert find_knobs("from torch.nn.functional import rms_norm\n\ny = rms_norm(x, (4,), num_warps=None)\n") == []


def test_a_count_of_tiles_is_tuned_as_a_count_not_a_size():
    """`subtiles=` of the attention seed's helper is how many tiles (1 or 2), not a tile size: its values are
    counts, never 16384."""
    thin = (ROOT / "seeds" / "attention_bwd.py").read_text()
    knobs = {k.key: k for k in find_knobs(thin)}
    assert knobs["attention_fwd_with_delta().subtiles#1"].choices() == [1, 2, 4, 8]


def test_a_value_whose_single_change_was_rejected_is_not_proposed_again():
    """The tuner learns from the loop's verdicts: a one-knob variant rejected before its timing blames that knob's
    value, which no later proposal uses; a two-knob variant blames neither."""
    tuner, known = Tuner(3), {sha256(LLM_KERNEL)}
    block = next(k for k in find_knobs(LLM_KERNEL) if k.key == "BLOCK_SIZE#1")
    bad = block.choices()[0]
    rejected = LLM_KERNEL.replace(f"BLOCK_SIZE = {block.value}", f"BLOCK_SIZE = {bad}")
    tuner.learn(LLM_KERNEL, rejected)
    assert ("BLOCK_SIZE#1", str(bad)) in tuner.failed
    two = rejected.replace("num_warps = 8 if", "num_warps = 16 if")
    tuner.learn(LLM_KERNEL, two)
    assert len(tuner.failed) == 1
    for _ in range(60):
        prop = tuner.mutate(LLM_KERNEL, known)
        if prop is None:
            break
        known.add(sha256(prop.source))
        sizes = {k.text for k in find_knobs(prop.source) if k.key == "BLOCK_SIZE#1"}
        assert sizes != {str(bad)}, prop.description


def test_a_knob_whose_verified_change_ran_the_parents_very_kernels_is_not_tuned_again():
    """A one-knob variant that verified with its parent's compiled kernels (same names, warps, stages, constexprs)
    changed code the task's shape never runs: the loop tells the tuner, which then proposes no value of that knob;
    a variant whose kernels differ, or one of two changes, teaches nothing."""
    from agent.archive.records import Candidate
    from agent.search.elites import Selection
    from agent.search.proposing import Pending, tuner_feedback
    from agent.search.tuner import compiled_signature

    def timed(warps):
        return {"timing": {"kernels": [{"name": "k", "num_warps": warps, "num_stages": 1, "constants": {"B": 64}}]}}

    def cand(source, diagnostics, verdict="accepted"):
        return Candidate(task_path="t.py", task_hash="h", origin="tuner", proposer="tuner", verdict=verdict,
                         reason="ok", source=source, diagnostics=diagnostics)
    tuner, known = Tuner(5), {sha256(LLM_KERNEL)}
    block = next(k for k in find_knobs(LLM_KERNEL) if k.key == "BLOCK_SIZE#1")
    variant = LLM_KERNEL.replace(f"BLOCK_SIZE = {block.value}", f"BLOCK_SIZE = {block.choices()[0]}")
    parent = cand(LLM_KERNEL, timed(4))

    def feed(source, diagnostics):
        tuner_feedback(tuner, Pending("tuner", "tuner", Selection("improve", [parent]), "", source=source),
                       cand(source, diagnostics))
    feed(variant, timed(8))  # other kernels: the knob matters
    assert tuner.inert == set()
    feed(variant.replace("num_warps = 8 if", "num_warps = 16 if"), timed(4))  # two changes: blames neither
    assert tuner.inert == set()
    assert compiled_signature(timed(4)) == compiled_signature(parent.diagnostics)
    feed(variant, timed(4))
    assert tuner.inert == {"BLOCK_SIZE#1"}
    for _ in range(60):
        prop = tuner.mutate(LLM_KERNEL, known)
        if prop is None:
            break
        known.add(sha256(prop.source))
        assert {k.text for k in find_knobs(prop.source) if k.key == "BLOCK_SIZE#1"} == {str(block.value)}

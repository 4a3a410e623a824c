"""CPU mirrors of seeds/attention_gluon.py's schedule (the kernel itself is Gluon, which Triton's interpreter cannot
run; benchmarks/sweep_attention_gluon.py checks it against float64 on the GPU):
- the maths in the kernel's order (key blocks last-first, the causal mask only in the prologue block, the
  accumulator's rescale deferred to the next step, P rounded to the input dtype before P V), in torch, against
  the float64 softmax; with do (the do= option) also delta = sum_j P_ij dP_ij, each block's rowsum(p dP) taken
  with the fp32 p in 64-column halves and rescaled by alpha as l is, over l at the end, against float64;
- the synchronisation: the producer and the consumers as Python coroutines over a model of mbarriers (phase
  parity, arrival counts, TMA transaction completion at a random later time), with the kernel's ring indices,
  phases and GEMM token, run under random interleavings: no deadlock, every wgmma reads the block it means and
  no slot is refilled while a wgmma may still read it, every tile's Q is the tile's own.
Both restate the kernel's index arithmetic; keep them in step with _fa3_loader / _fa3_consumer."""
from __future__ import annotations

import math
import random

import pytest
import torch

LOG2E = 1.4426950408889634


# ---- the maths ------------------------------------------------------------------------------------------------
def _p_dp_rowsum(p, do_t, v_blk):
    """_p_dp_rowsum: rowsum(p dP), dP = dO V^T in fp32, by 64-column halves of the key block."""
    part = torch.zeros(p.shape[0])
    for c0 in range(0, v_blk.shape[0], 64):
        part = part + (p[:, c0:c0 + 64] * (do_t @ v_blk[c0:c0 + 64].T)).sum(dim=1)
    return part


def mirror_forward(q, k, v, causal, block_m=128, block_n=128, consumers=1, do=None):
    """(o, lse2) of one [S, D] head in the kernel's step order, fp32 with P rounded to q's dtype; with do,
    (o, lse2, delta) as WITH_DELTA computes it (dP_i once block i's softmax is done, with its fp32 p)."""
    s_len, d = q.shape
    qk_scale = LOG2E / math.sqrt(d)
    m_c = block_m // consumers
    o = torch.empty(s_len, d)
    lse2 = torch.empty(s_len)
    delta = torch.empty(s_len)
    qf, kf, vf = q.float(), k.float(), v.float()
    dof = do.float() if do is not None else None
    for tile in range(s_len // block_m):
        n_blocks = (tile * block_m + block_m) // block_n if causal else s_len // block_n
        for cid in range(consumers):
            r0 = tile * block_m + cid * m_c
            qt = qf[r0:r0 + m_c]
            dot = dof[r0:r0 + m_c] if do is not None else None
            blocks = [n_blocks - 1 - i for i in range(n_blocks)]  # last-first
            kb = lambda j: kf[j * block_n:(j + 1) * block_n]  # noqa: E731
            vb = lambda j: vf[j * block_n:(j + 1) * block_n]  # noqa: E731
            acc = torch.zeros(m_c, d)
            s = qt @ kb(blocks[0]).T
            if causal:
                q_pos = torch.arange(r0, r0 + m_c)[:, None]
                k_pos = torch.arange(blocks[0] * block_n, (blocks[0] + 1) * block_n)[None, :]
                s = s.masked_fill(k_pos > q_pos, float("-inf"))
            m = s.max(dim=1).values * qk_scale
            p = torch.exp2(s * qk_scale - m[:, None])
            l = p.sum(dim=1)
            if do is not None:
                dsum = _p_dp_rowsum(p, dot, vb(blocks[0]))
            p_op = p.to(q.dtype).float()
            alpha = torch.ones(m_c)
            for i in range(1, n_blocks):
                s = qt @ kb(blocks[i]).T
                acc = acc * alpha[:, None]
                acc = acc + p_op @ vb(blocks[i - 1])
                m_new = torch.maximum(m, s.max(dim=1).values * qk_scale)
                alpha = torch.exp2(m - m_new)
                p = torch.exp2(s * qk_scale - m_new[:, None])
                l = l * alpha + p.sum(dim=1)
                m = m_new
                if do is not None:
                    dsum = dsum * alpha + _p_dp_rowsum(p, dot, vb(blocks[i]))
                p_op = p.to(q.dtype).float()
            acc = acc * alpha[:, None]
            acc = acc + p_op @ vb(blocks[-1])
            o[r0:r0 + m_c] = acc / l[:, None]
            lse2[r0:r0 + m_c] = m + torch.log2(l)
            if do is not None:
                delta[r0:r0 + m_c] = dsum / l
    return (o.to(q.dtype), lse2) if do is None else (o.to(q.dtype), lse2, delta)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block_n,consumers", [(128, 1), (128, 2), (64, 1)])
def test_mirror_maths_match_float64(causal, block_n, consumers):
    if causal and block_n != 128:
        pytest.skip("causal takes block_n == block_m")
    gen = torch.Generator().manual_seed(3)
    s_len, d = 512, 64
    q, k, v = (torch.randn(s_len, d, generator=gen).to(torch.bfloat16) for _ in range(3))
    o, lse2 = mirror_forward(q, k, v, causal, 128, block_n, consumers)
    sc = q.double() @ k.double().T / math.sqrt(d)
    if causal:
        sc = sc.masked_fill(torch.ones(s_len, s_len, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(sc, dim=-1)
    truth = torch.exp(sc - lse[:, None]) @ v.double()
    ref = torch.nn.functional.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=causal)[0]
    err = float((o.double() - truth).norm() / truth.norm())
    ref_err = float((ref.double() - truth).norm() / truth.norm())
    assert err <= max(3 * ref_err, 5e-3), (err, ref_err)
    assert float((lse2.double() * math.log(2) - lse).abs().max()) <= 1e-4


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block_n,consumers", [(128, 1), (128, 2), (64, 1), (64, 2)])
@pytest.mark.parametrize("dist", ["normal", "outliers"])
def test_mirror_delta_matches_float64(causal, block_n, consumers, dist):
    """delta in the kernel's order against the float64 sum_j P_ij dP_ij (P the float64 softmax, dP = dO V^T of the
    bf16 inputs): within fp32 rounding of the row's sum_j P |dP|, and far closer than the delta a FlashAttention-2
    preprocess takes from the rounded o (rowsum(dO o o)), which carries P's bf16 rounding for P V."""
    if causal and block_n != 128:
        pytest.skip("causal takes block_n == block_m")
    gen = torch.Generator().manual_seed(5)
    s_len, d = 512, 128
    q, k, v, do = (torch.randn(s_len, d, generator=gen) for _ in range(4))
    if dist == "outliers":  # a few large scores: rows taken by few keys
        q[::37] *= 8.0
    q, k, v, do = (t.to(torch.bfloat16) for t in (q, k, v, do))
    o, lse2, delta = mirror_forward(q, k, v, causal, 128, block_n, consumers, do=do)
    o_only, lse_only = mirror_forward(q, k, v, causal, 128, block_n, consumers)
    assert torch.equal(o, o_only) and torch.equal(lse2, lse_only)  # do changes nothing else
    sc = q.double() @ k.double().T / math.sqrt(d)
    if causal:
        sc = sc.masked_fill(torch.ones(s_len, s_len, dtype=torch.bool).triu(1), float("-inf"))
    prob = torch.softmax(sc, dim=-1)
    dp = do.double() @ v.double().T
    truth = (prob * dp).sum(dim=1)
    scale = (prob * dp.abs()).sum(dim=1)
    err = (delta.double() - truth).abs()
    assert float((err / scale).max()) <= 1e-5, float((err / scale).max())
    fa2 = (do.double() * o.double()).sum(dim=1)  # the preprocess's delta from the stored o
    assert float(err.norm()) < 0.1 * float((fa2 - truth).norm()), (float(err.norm()), float((fa2 - truth).norm()))


# ---- the synchronisation ----------------------------------------------------------------------------------------
class Bar:
    """An mbarrier: `count` arrivals (and expected TMA bytes, here one transaction) complete a phase."""

    def __init__(self, count):
        self.count, self.pending, self.completed = count, count, 0

    def arrive(self):
        self.pending -= 1
        assert self.pending >= 0
        if self.pending == 0:
            self.completed += 1
            self.pending = self.count

    def passed(self, parity):  # wait(parity) returns once the phase of that parity is complete
        return (self.completed & 1) != parity


class Machine:
    """Shared memory slots (what block each holds), barriers, in-flight TMA copies and wgmma reads."""

    def __init__(self, stages, consumers, rng, delta=False):
        self.rng = rng
        self.k_slot, self.v_slot = [None] * stages, [None] * stages
        self.q_slot = [None] * consumers
        self.do_slot = [None] * consumers  # WITH_DELTA: dO, loaded with Q on its barrier
        self.k_ready = [Bar(1) for _ in range(stages)]
        self.v_ready = [Bar(1) for _ in range(stages)]
        self.k_empty = [Bar(consumers) for _ in range(stages)]
        self.v_empty = [Bar(consumers) for _ in range(stages)]
        self.q_bars = [Bar(2 if delta else 1) for _ in range(consumers)]  # (two copies, one transaction count)
        self.q_empty = [Bar(1) for _ in range(consumers)]
        self.turn = [Bar(1), Bar(1)]
        self.copies = []     # (slots list, index, value, barrier): TMA loads in flight
        self.reading = []    # (id of the slots list, index, value): operands of issued, unretired wgmma

    def tma_load(self, slots, idx, value, bar):
        for sl, i, _ in self.reading:  # a refill of a slot some wgmma may still read
            assert not (sl == id(slots) and i == idx), f"slot {idx} refilled while read"
        self.copies.append((slots, idx, value, bar))

    def land_one(self):
        slots, idx, value, bar = self.copies.pop(self.rng.randrange(len(self.copies)))
        for sl, i, _ in self.reading:
            assert not (sl == id(slots) and i == idx), f"slot {idx} overwritten while read"
        slots[idx] = value
        bar.arrive()


def loader(mc, tiles, n_blocks_of, stages, consumers, delta=False):
    it = tc = 0
    for t in tiles:
        n_blocks = n_blocks_of(t)
        for i in range(n_blocks):
            j = it + i
            st, ph = j % stages, (j // stages) & 1
            blk = (t, n_blocks - 1 - i)
            yield mc.k_empty[st], ph ^ 1
            mc.tma_load(mc.k_slot, st, blk, mc.k_ready[st])
            if i == 0:
                for c in range(consumers):
                    yield mc.q_empty[c], (tc & 1) ^ 1
                    mc.tma_load(mc.q_slot, c, (t, c), mc.q_bars[c])
                    if delta:
                        mc.tma_load(mc.do_slot, c, (t, c), mc.q_bars[c])
            yield mc.v_empty[st], ph ^ 1
            mc.tma_load(mc.v_slot, st, blk, mc.v_ready[st])
        it += n_blocks
        tc += 1


def consumer(mc, cid, tiles, n_blocks_of, stages, pingpong, persistent, log, delta=False):
    """_fa3_consumer's barrier traffic; a wgmma 'reads' its operands from issue to its retiring wait. delta: each
    block's dP = dO V^T once its softmax is done and the previous P V retired, on V's stage (waited for then)."""
    def dp(st, ph, blk):  # WITH_DELTA's dP wgmma (its halves issued and waited in turn: one read here)
        yield mc.v_ready[st], ph
        assert mc.v_slot[st] == blk and mc.do_slot[cid] == (blk[0], cid), (mc.v_slot[st], blk)
        reads = [(id(mc.v_slot), st, mc.v_slot[st]), (id(mc.do_slot), cid, mc.do_slot[cid])]
        mc.reading += reads
        yield None
        for r in reads:
            mc.reading.remove(r)

    def token_wait(step):
        if pingpong:
            return (mc.turn[0], (step & 1) ^ 1) if cid == 0 else (mc.turn[1], step & 1)
        return None

    def token_pass():
        if pingpong:
            mc.turn[1 - cid].arrive()

    it = tc = 0
    for t in tiles:
        n_blocks = n_blocks_of(t)
        yield mc.q_bars[cid], tc & 1
        assert mc.q_slot[cid] == (t, cid)
        st = it % stages
        if (w := token_wait(it + tc)):
            yield w
        yield mc.k_ready[st], (it // stages) & 1
        assert mc.k_slot[st] == (t, n_blocks - 1) and mc.q_slot[cid] == (t, cid)
        s_read = [(id(mc.k_slot), st, mc.k_slot[st]), (id(mc.q_slot), cid, mc.q_slot[cid])]
        mc.reading += s_read
        token_pass()
        yield None  # other work may run while the wgmma is in flight
        for r in s_read:
            mc.reading.remove(r)
        mc.k_empty[st].arrive()
        if delta:
            yield from dp(st, (it // stages) & 1, (t, n_blocks - 1))
        for i in range(1, n_blocks):
            j = it + i
            st, prev = j % stages, (j - 1) % stages
            if (w := token_wait(j + tc)):
                yield w
            yield mc.k_ready[st], (j // stages) & 1
            assert mc.k_slot[st] == (t, n_blocks - 1 - i), (mc.k_slot[st], t, i)
            s_read = [(id(mc.k_slot), st, mc.k_slot[st]), (id(mc.q_slot), cid, mc.q_slot[cid])]
            mc.reading += s_read
            yield mc.v_ready[prev], ((j - 1) // stages) & 1
            assert mc.v_slot[prev] == (t, n_blocks - i), (mc.v_slot[prev], t, i)
            pv_read = [(id(mc.v_slot), prev, mc.v_slot[prev])]
            mc.reading += pv_read
            token_pass()
            yield None
            for r in s_read:  # wait(1): S retired
                mc.reading.remove(r)
            mc.k_empty[st].arrive()
            yield None
            for r in pv_read:  # wait(0): P V retired
                mc.reading.remove(r)
            mc.v_empty[prev].arrive()
            if delta:
                yield from dp(st, (j // stages) & 1, (t, n_blocks - 1 - i))
        j = it + n_blocks - 1
        last = j % stages
        if (w := token_wait(j + 1 + tc)):
            yield w
        yield mc.v_ready[last], (j // stages) & 1
        assert mc.v_slot[last] == (t, 0)
        pv_read = [(id(mc.v_slot), last, mc.v_slot[last])]
        mc.reading += pv_read
        token_pass()
        yield None
        for r in pv_read:
            mc.reading.remove(r)
        mc.v_empty[last].arrive()
        if persistent:
            mc.q_empty[cid].arrive()
        log.append((cid, t))
        yield None  # o through the Q buffer (not persistent) / its own buffer: the store in flight
        if not persistent:
            mc.q_empty[cid].arrive()
        it += n_blocks
        tc += 1


def run_schedule(seed, stages, consumers, pingpong, persistent, causal, programs_tiles, delta=False):
    rng = random.Random(seed)
    num_m = 4
    n_blocks_of = (lambda t: (t % num_m) + 1) if causal else (lambda t: 4)
    mc = Machine(stages, consumers, rng, delta)
    log = []
    procs = [loader(mc, programs_tiles, n_blocks_of, stages, consumers, delta)]
    procs += [consumer(mc, c, programs_tiles, n_blocks_of, stages, pingpong, persistent, log, delta)
              for c in range(consumers)]
    waiting = [None] * len(procs)
    alive = set(range(len(procs)))
    steps = 0
    while alive or mc.copies:
        steps += 1
        assert steps < 100000
        runnable = [i for i in alive if waiting[i] is None or waiting[i][0].passed(waiting[i][1])]
        if mc.copies and (not runnable or rng.random() < 0.3):
            mc.land_one()
            continue
        assert runnable, "deadlock: every partition waits and no copy is in flight"
        i = rng.choice(runnable)
        try:
            waiting[i] = next(procs[i])
        except StopIteration:
            alive.discard(i)
            waiting[i] = None
    assert sorted(log) == sorted((c, t) for c in range(consumers) for t in programs_tiles)


@pytest.mark.parametrize("stages", [1, 2, 3])
@pytest.mark.parametrize("consumers,pingpong", [(1, False), (2, True), (2, False)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("delta", [False, True])
def test_schedule_never_deadlocks_or_races(stages, consumers, pingpong, causal, delta):
    """One program's tiles under 40 random interleavings: a single tile (the grid launch) and 5 tiles
    (persistent: the ring's slots and phases and the GEMM token's steps run on across tiles; causal: tiles of
    1 to 4 key blocks); delta: the do= option's dO tiles and dP reads of V."""
    for seed in range(40):
        run_schedule(seed, stages, consumers, pingpong, False, causal, [2], delta)
        run_schedule(seed, stages, consumers, pingpong, True, causal, [0, 3, 5, 6, 7], delta)


# ---- the tile order ---------------------------------------------------------------------------------------------
def program_tiles(pid, programs, tiles, num_m, causal, persistent):
    """(head, query tile) of each of a program's tiles, in order: _my_tiles and _tile's arithmetic."""
    pairs = causal and persistent
    if pairs:
        n = 2 * -(-max(tiles // 2 - pid, 0) // programs)
    else:
        n = -(-max(tiles - pid, 0) // programs)
    out = []
    for u in range(n):
        if pairs:
            half = num_m // 2
            pair = pid + (u // 2) * programs
            bh, j = pair // half, pair % half
            m = j + (u % 2 == 0) * (num_m - 1 - 2 * j)
        else:
            t = pid + u * programs
            m = t % num_m
            if causal:
                m = num_m - 1 - m
            bh = t // num_m
        out.append((bh, m))
    return out


@pytest.mark.parametrize("causal,persistent", [(False, False), (True, False), (False, True), (True, True)])
def test_tile_order_visits_every_tile_once(causal, persistent):
    """Every (head, query tile) once over the programs, at the launcher's program counts (the grid: one tile each;
    persistent: min(tiles, SMs), causal min(tiles / 2, SMs)); causal persistent pairs cost NUM_M + 1 key blocks."""
    for num_m, heads in ((32, 128), (4, 3), (16, 16), (2, 1)):
        tiles = num_m * heads
        for sms in (132, 7, 1):
            programs = min(tiles // 2 if causal else tiles, sms) if persistent else tiles
            seen = []
            for pid in range(programs):
                mine = program_tiles(pid, programs, tiles, num_m, causal, persistent)
                if causal and persistent:
                    for a, b in zip(mine[::2], mine[1::2]):
                        assert a[0] == b[0] and (a[1] + 1) + (b[1] + 1) == num_m + 1 and a[1] > b[1]
                seen += mine
            assert sorted(seen) == [(h, m) for h in range(heads) for m in range(num_m)], (num_m, heads, sms)

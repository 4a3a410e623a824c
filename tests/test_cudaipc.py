"""The parent's side of lending GPU memory (sandbox.cudaipc.Lending), with the CUDA calls replaced: staging blocks
are reused call after call and across shapes and dtypes, never handed out twice in one request (a task whose output
has its input's shape must not see its input poisoned), hold what was copied in, and past the cap tensors travel by
value. The CUDA handles
themselves are exercised on the GPU (tests/test_harness_gpu.py, tests/test_walls.py with CRUCIBLE_TEST_DEVICE=cuda)."""
import pytest
import torch

from sandbox import cudaipc


@pytest.fixture
def lending(monkeypatch):
    handles = iter(range(1, 1 << 20))
    monkeypatch.setattr(cudaipc, "_lendable", lambda x: x.numel() > 0)
    monkeypatch.setattr(cudaipc, "lend", lambda t: cudaipc.Lent(next(handles).to_bytes(64, "little"), 0,
                                                                t.untyped_storage().nbytes(), str(t.dtype)[6:],
                                                                tuple(t.shape), tuple(t.stride()), 0, 0))
    return cudaipc.Lending(cap=4 * 64 * 4)  # room for four 8x8 float32 tensors


def _handles(wire):
    return [w[1].handle for w in wire if isinstance(w, tuple)]


def test_one_request_never_gets_the_same_staging_twice(lending):
    x = torch.randn(8, 8)
    used: set[int] = set()
    wire_in, staged_in = lending.ship([x, 3, x], used)
    poison = torch.full((8, 8), float("nan"))
    wire_out, staged_out = lending.ship([poison], used)
    handles = _handles(wire_in) + _handles(wire_out)
    assert len(handles) == 3 and len(set(handles)) == 3
    assert wire_in[1] == 3 and staged_in[1] is None
    assert torch.equal(staged_in[0], x) and torch.equal(staged_in[2], x)  # the poison did not land on the inputs
    assert staged_out[0].isnan().all()


def test_later_requests_reuse_the_staging_and_see_their_own_data(lending):
    first, second = torch.randn(8, 8), torch.randn(8, 8)
    wire1, staged1 = lending.ship([first], set())
    wire2, staged2 = lending.ship([second], set())
    assert _handles(wire1) == _handles(wire2) and staged1[0].data_ptr() == staged2[0].data_ptr()
    assert torch.equal(staged2[0], second) and lending.held == 64 * 4


def test_strides_are_kept_and_overlapping_views_become_dense(lending):
    t = torch.randn(8, 4).t()  # dense, not contiguous
    e = torch.randn(1, 8).expand(8, 8)  # overlapping: stride 0
    wire, staged = lending.ship([t, e], set())
    assert staged[0].stride() == t.stride() and torch.equal(staged[0], t)
    assert staged[1].is_contiguous() and torch.equal(staged[1], e)


def test_past_the_cap_a_tensor_goes_by_value(lending):
    big = torch.randn(16, 16)  # 1 KiB: the whole cap
    small = torch.randn(8, 8)
    wire, staged = lending.ship([big, small], set())
    assert isinstance(wire[0], tuple) and staged[0] is not None
    assert isinstance(wire[1], torch.Tensor) and staged[1] is None and torch.equal(wire[1], small)
    lending.release()
    assert lending.held == 0
    wire, staged = lending.ship([small], set())
    assert isinstance(wire[0], tuple)  # released: room again


def test_a_block_serves_any_shape_and_dtype_that_fits(lending):
    wire, staged = lending.ship([torch.randn(8, 8)], set())  # 256 bytes
    held = lending.held
    smaller = torch.randn(3, 5).to(torch.bfloat16)  # 30 bytes, another dtype: the same block
    wire2, staged2 = lending.ship([smaller], set())
    assert _handles(wire2) == _handles(wire) and lending.held == held
    lent = wire2[0][1]
    assert (lent.dtype, lent.shape, lent.stride, lent.nbytes) == ("bfloat16", (3, 5), (5, 1), 30)
    assert torch.equal(staged2[0], smaller)
    # what the child maps (the block's first `nbytes` bytes, viewed as the Lent says) is the staged copy
    raw = staged2[0].untyped_storage()
    mapped = torch.tensor([], dtype=torch.uint8).set_(raw)[:lent.nbytes].view(torch.bfloat16).as_strided(
        lent.shape, lent.stride, lent.storage_offset)
    assert torch.equal(mapped, smaller)
    bigger = torch.randn(16, 8)  # 512 bytes: past every block, so a new one
    wire3, _ = lending.ship([bigger], set())
    assert _handles(wire3) != _handles(wire) and lending.held == held + 512


def test_the_smallest_free_block_that_fits_is_taken(lending):
    big, small = torch.randn(16, 8), torch.randn(4, 4)
    used: set[int] = set()
    wire, _ = lending.ship([big, small], used)  # two blocks: 512 and 64 bytes
    wire2, _ = lending.ship([torch.randn(2, 4)], set())  # 32 bytes: the 64-byte block, not the 512
    assert _handles(wire2) == [wire[1][1].handle]

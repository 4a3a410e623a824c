"""The parent's side of lending GPU memory (sandbox.cudaipc.Lending), with the CUDA calls replaced: staging copies
are reused call after call, never handed out twice in one request (a task whose output has its input's shape must
not see its input poisoned), hold what was copied in, and past the cap tensors travel by value. The CUDA handles
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
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
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
    assert _handles(wire1) == _handles(wire2) and staged1[0] is staged2[0]
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

"""The derived input sets (sandbox/timing_child.derive): every soak call and timing set after the base sets is its
base set's floating inputs rolled along the last dimension and rescaled. The parent repeats the derivation to
compute a checked call's expected output, so it must be exactly torch.roll followed by an in-place multiply (one
rounding) whatever the dtype and shape, written in one pass to a fresh tensor."""
from __future__ import annotations

import pytest
import torch

from sandbox.timing_child import derive, rolled


def _definition(x: torch.Tensor, k: int) -> torch.Tensor:
    """What derive must give for a floating input of a derived set: roll, then multiply in place."""
    y = torch.roll(x, shifts=(7919 * k) % x.shape[-1], dims=-1)
    if k % 17:
        y.mul_(1.0 + 0.01 * (k % 17))
    return y


def _bits(t: torch.Tensor) -> torch.Tensor:
    kind = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.contiguous().view(kind)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(5, 7), (3, 4, 13), (1,), (6, 1), (2, 8)])
def test_derived_floating_inputs_equal_roll_then_scale_bit_for_bit(dtype, shape):
    gen = torch.Generator().manual_seed(7)
    base = [[(torch.randn(shape, generator=gen) * 30).to(dtype)] for _ in range(2)]
    for k in range(2, 40):  # k % 17 == 0 (no scaling) at 17 and 34; shifts of 0 wherever 7919 k is a multiple
        got = derive(base, k, ())[0]
        want = _definition(base[k % 2][0], k)
        assert got.dtype == dtype and got.shape == want.shape and got.is_contiguous()
        assert torch.equal(_bits(got), _bits(want)), (k, dtype, shape)


def test_derived_inputs_are_fresh_tensors_and_the_others_are_copies():
    base = [[torch.randn(4, 6), torch.arange(6), torch.randn(4, 6)], [torch.randn(4, 6), torch.arange(6),
                                                                        torch.randn(4, 6)]]
    for k in (0, 1, 2, 5):
        got = derive(base, k, fixed=(2,))
        src = base[k % 2]
        for g, x in zip(got, src):
            assert g.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
        assert torch.equal(got[1], src[1])  # integers: copied as they are
        assert torch.equal(got[2], src[2])  # a fixed input: copied as it is
        if k < 2:  # the base sets themselves: copies
            assert torch.equal(got[0], src[0])
        else:
            assert torch.equal(got[0], _definition(src[0], k))
            assert not torch.equal(got[0], src[0])


def test_a_strided_input_is_derived_from_its_values():
    x = torch.randn(9, 5).t()  # [5, 9], not contiguous
    got = rolled(x, 4, 1.03)
    assert got.is_contiguous()
    assert torch.equal(got, torch.roll(x, 4, dims=-1).mul_(1.03))


def _odd_bases(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(11)
    big = torch.finfo(dtype).max
    special = torch.tensor([0.0, -0.0, float("nan"), float("inf"), -float("inf"), big, -big,
                            torch.finfo(dtype).tiny, torch.finfo(dtype).tiny / 4, 1.0, -3.5], dtype=torch.float64)
    return {
        "transposed": (torch.randn(13, 6, generator=gen) * 40).to(dtype).t(),
        "stepped": (torch.randn(4, 30, generator=gen) * 40).to(dtype)[:, ::3],
        "expanded": (torch.randn(1, 9, generator=gen) * 40).to(dtype).expand(5, 9),
        "channels_last": (torch.randn(2, 3, 4, 5, generator=gen) * 40).to(dtype)
        .contiguous(memory_format=torch.channels_last),
        "offset_view": (torch.randn(50, generator=gen) * 40).to(dtype)[3:3 + 35].view(5, 7),
        "specials": special.to(dtype).repeat(3, 1),  # NaN, Inf, -0, max (overflows when scaled), subnormals
        "last_dim_1": (torch.randn(7, 1, generator=gen)).to(dtype),
        "long_row": (torch.randn(2, 4099, generator=gen)).to(dtype),
    }


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_derive_is_roll_then_scale_on_strided_special_and_edge_inputs(dtype):
    """Strided, expanded and offset bases, NaN, Inf, -0, the dtype's largest (overflowing when scaled) and
    subnormals, a last dim of 1, long rows, every k % 17: the same values as roll then mul_ (a NaN's payload
    aside: the halves take ATen's scalar loop where a whole tensor took its vectorised one)."""
    for name, x in _odd_bases(dtype).items():
        base = [[x], [x.clone()]]
        for k in range(2, 70):  # every k % 17 (17, 34, 51: unscaled), shifts of 0 included
            got = derive(base, k, ())[0]
            want = _definition(base[k % 2][0], k)
            assert got.shape == want.shape and got.dtype == dtype, (name, k)
            nan = torch.isnan(want)
            assert torch.equal(torch.isnan(got), nan), (name, dtype, k)
            assert torch.equal(_bits(got)[~nan], _bits(want)[~nan]), (name, dtype, k)


def test_derive_leaves_empty_complex_integer_and_scalar_inputs_as_copies():
    """A 0-size last dim or other dim, complex, integer and 0-d inputs: copied, never rolled or scaled."""
    xs = [torch.empty(4, 0), torch.empty(0, 5), torch.randn(3, 5, dtype=torch.complex64), torch.arange(10),
          torch.tensor(2.5)]
    for k in (2, 3, 17):
        got = derive([xs, [x.clone() for x in xs]], k, ())
        for g, x in zip(got, xs):
            assert g.shape == x.shape and g.dtype == x.dtype and torch.equal(g, x)

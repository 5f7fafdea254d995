"""The fake answer to the experts' grouped matmul is the output the CPU kernel allocates: its
shape, its padded rows (what a rank holds and saves), its dtype, inside a fake run too."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from pipesched.runtime.engine.fake_kernels import FakeKernels, grouped_mm_output  # noqa: E402

pytestmark = pytest.mark.torch

OFFS = torch.tensor([3, 7, 10], dtype=torch.int32)


def _experts(groups: int, k: int, n: int) -> torch.Tensor:
    """Expert weights as transformers passes them: (groups, k, n), column-major in the last two."""
    return torch.randn(groups, n, k).transpose(1, 2)


@pytest.mark.parametrize("n", [13, 16])  # rows padded to 16 bytes, and not
@pytest.mark.parametrize("a_shape, offs", [((10, 12), OFFS), ((3, 10, 12), None)])  # tokens by group; batched
def test_the_output_is_shaped_and_strided_as_the_cpu_kernel_allocates_it(a_shape, offs, n):
    a, b = torch.randn(*a_shape), _experts(3, 12, n)
    real = torch._grouped_mm(a, b, offs) if offs is not None else torch._grouped_mm(a, b)
    answered = grouped_mm_output(a, b, offs, None)
    assert (answered.shape, answered.stride(), answered.dtype) == (real.shape, real.stride(), real.dtype)


def test_inside_a_fake_run_fp32_experts_are_answered_where_the_fake_kernel_refuses_them():
    with FakeTensorMode(allow_non_fake_inputs=True):
        a, b = torch.empty(10, 16), _experts(3, 16, 16)
        with pytest.raises(RuntimeError, match="BF16"):
            torch._grouped_mm(a, b, OFFS)
        with FakeKernels():
            out = torch._grouped_mm(a, b, OFFS)
            bf16 = torch._grouped_mm(a.bfloat16(), b.bfloat16(), OFFS)  # passed to the fake kernel as is
    assert (out.shape, out.dtype) == ((10, 16), torch.float32)
    assert (bf16.shape, bf16.dtype) == ((10, 16), torch.bfloat16)

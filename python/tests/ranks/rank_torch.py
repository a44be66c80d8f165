"""Real torch tensors (where torch is installed; CI does not install it): used in place through
DLPack, every torch dtype the library reduces, lists of tensors, and the clear refusals."""

import pytest

torch = pytest.importorskip("torch")

import distcomm as dist  # noqa: E402


def test_torch_tensors_in_place(rank, size):
    tri = size * (size + 1) / 2
    for dt in [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.uint8]:
        t = torch.full((4,), rank + 1, dtype=dt)
        dist.all_reduce(t)
        assert t.tolist() == [tri] * 4, dt
    b = torch.full((3,), float(rank + 1), dtype=torch.bfloat16)
    dist.all_reduce(b, op=dist.ReduceOp.MAX)
    assert b.tolist() == [float(size)] * 3


def test_torch_lists_and_into_tensor(rank, size):
    outs = [torch.zeros(2, dtype=torch.int64) for _ in range(size)]
    dist.all_gather(outs, torch.tensor([rank, 10 * rank]))
    assert [o.tolist() for o in outs] == [[r, 10 * r] for r in range(size)]
    whole = torch.zeros(2 * size)
    dist.all_gather_into_tensor(whole, torch.tensor([float(rank)] * 2))
    assert whole.tolist() == [float(r) for r in range(size) for _ in range(2)]


def test_torch_refusals(rank, size):
    with pytest.raises(dist.DistInvalidArgument, match="C-contiguous"):
        dist.all_reduce(torch.arange(6.0).reshape(2, 3).t())
    with pytest.raises(dist.DistInvalidArgument, match="DLPack"):
        dist.all_reduce(torch.ones(3, requires_grad=True))

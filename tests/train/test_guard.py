"""guarded_step: micro-batch parts add up to one step; a non-finite loss or gradient changes no weight."""

from __future__ import annotations

import torch

from polyturn.train.guard import guarded_step


def _setup():
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 1)
    return lin, torch.optim.SGD(lin.parameters(), lr=0.1)


def test_parts_step_like_their_sum():
    x = torch.randn(4, 3)
    a, opt_a = _setup()
    b, opt_b = _setup()
    assert guarded_step(a(x).pow(2).sum(), [opt_a], list(a.parameters()), 10.0)[0] == "ok"
    parts = (b(x[i : i + 2]).pow(2).sum() for i in (0, 2))
    assert guarded_step(parts, [opt_b], list(b.parameters()), 10.0)[0] == "ok"
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.allclose(p, q, atol=1e-6)
    assert not torch.equal(a.weight, _setup()[0].weight)  # it did step


def test_nonfinite_loss_and_gradient_change_nothing():
    lin, opt = _setup()
    before = [p.detach().clone() for p in lin.parameters()]
    x = torch.randn(2, 3)
    # The first part is fine and backpropagated; the second is NaN: the step is refused, gradients cleared.
    parts = iter([lin(x).sum(), lin(x).sum() * float("nan")])
    assert guarded_step(parts, [opt], list(lin.parameters()), 1.0)[0] == "nonfinite_loss"
    assert all(p.grad is None for p in lin.parameters())
    # A finite loss (0) whose gradient is not: d sqrt(u)/du is infinite at u = 0.
    kink = torch.sqrt((lin.weight - lin.weight.detach()).abs().sum())
    assert torch.isfinite(kink)
    assert guarded_step(kink, [opt], list(lin.parameters()), 1.0)[0] == "nonfinite_grad"
    for p, q in zip(lin.parameters(), before):
        assert torch.equal(p, q)

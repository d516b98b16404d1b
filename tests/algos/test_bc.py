"""bc_loss: masked NLL of demonstrated action tokens."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from polyturn.algos import bc_loss

F64 = torch.float64


def test_hand_computed_nll_perplexity_and_accuracy():
    # probabilities of the target tokens: 0.5, 0.25, (observation token), 1.0
    logprobs = torch.tensor([[math.log(0.5), math.log(0.25), math.nan, 0.0]], dtype=F64)
    logprobs.requires_grad_()
    mask = torch.tensor([[1, 1, 0, 1]])
    out = bc_loss(logprobs, mask, correct=torch.tensor([[True, False, True, True]]))
    # NLL = (ln 2 + ln 4 + 0) / 3 = 3 ln 2 / 3 = ln 2 ; perplexity = e^{ln 2} = 2
    assert_close(out["loss"], torch.tensor(math.log(2), dtype=F64))
    assert_close(out["perplexity"], torch.tensor(2.0, dtype=F64))
    # accuracy over the 3 action tokens: 2 / 3 (the masked token does not count)
    assert_close(out["token_accuracy"], torch.tensor(2 / 3, dtype=F64))
    out["loss"].backward()
    assert_close(logprobs.grad, torch.tensor([[-1 / 3, -1 / 3, 0.0, -1 / 3]], dtype=F64))


def test_without_correct_there_is_no_accuracy():
    out = bc_loss(torch.zeros(2, 3), torch.ones(2, 3))
    assert set(out) == {"loss", "perplexity"}


def test_seq_mean_aggregation():
    logprobs = torch.tensor([[-1.0, -3.0], [-4.0, 0.0]], dtype=F64)
    mask = torch.tensor([[1, 1], [1, 0]])
    # per-sequence means 2 and 4 -> 3 ; token mean would be (1 + 3 + 4) / 3 = 8/3
    assert_close(bc_loss(logprobs, mask, agg="seq_mean_token_mean")["loss"], torch.tensor(3.0, dtype=F64))
    assert_close(bc_loss(logprobs, mask)["loss"], torch.tensor(8 / 3, dtype=F64))


def test_errors():
    with pytest.raises(TypeError, match="Expected logprobs to be a floating-point tensor"):
        bc_loss(torch.zeros(1, 2, dtype=torch.long), torch.ones(1, 2))
    with pytest.raises(ValueError, match=r"Expected correct to have shape \(1, 2\)"):
        bc_loss(torch.zeros(1, 2), torch.ones(1, 2), correct=torch.ones(1, 3))

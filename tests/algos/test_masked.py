"""masked_mean and the loss aggregation modes."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from polyturn.algos import aggregate, masked_mean

F64 = torch.float64

X = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 9.0, 9.0, 9.0], [9.0, 9.0, 9.0, 9.0]], dtype=F64)
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])


def test_token_mean_weighs_every_token_equally():
    # (1 + 2 + 3 + 4) / 4 tokens
    assert_close(aggregate(X, MASK, "token_mean"), torch.tensor(2.5, dtype=F64))


def test_seq_mean_token_mean_weighs_every_sequence_equally():
    # row means 2 and 4; the empty row does not count: (2 + 4) / 2
    assert_close(aggregate(X, MASK, "seq_mean_token_mean"), torch.tensor(3.0, dtype=F64))


def test_seq_mean_token_sum():
    # row sums 6 and 4: (6 + 4) / 2
    assert_close(aggregate(X, MASK, "seq_mean_token_sum"), torch.tensor(5.0, dtype=F64))


def test_empty_mask_gives_zero_not_nan():
    for agg in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum"):
        assert aggregate(X, torch.zeros_like(MASK), agg).item() == 0.0


def test_masked_mean_along_a_dimension_and_nan_outside_mask():
    x = X.clone()
    x[0, 3] = float("nan")
    assert_close(masked_mean(x, MASK, dim=1), torch.tensor([2.0, 4.0, 0.0], dtype=F64))


def test_unknown_agg_is_rejected():
    with pytest.raises(ValueError, match="Expected agg to be one of"):
        aggregate(X, MASK, "sum")  # type: ignore[arg-type]

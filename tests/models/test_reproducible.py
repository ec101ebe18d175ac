"""A product's bits do not depend on its position in a batch (determinism across stacks, models/__init__):
MKL's batched product, without its strict reproducibility mode, computes every second matrix of a batch
by another path (measured: odd positions differ in the last bits for [7, 500] @ [500, 7])."""

from __future__ import annotations

import os

import pytest
import torch

from models.densities import bmm


def test_strict_reproducibility_is_set_for_mkl():
    assert os.environ.get("MKL_CBWR") == "AUTO,STRICT"


@pytest.mark.parametrize(("m", "k", "n"), [(3, 500, 3), (7, 500, 7), (61, 500, 61), (5, 40, 5), (12, 500, 12)])
def test_each_product_of_a_batch_equals_it_alone(m, k, n):
    g = torch.Generator().manual_seed(m * k + n)
    a = torch.randn(16, m, k, generator=g, dtype=torch.float64)
    b = torch.randn(16, k, n, generator=g, dtype=torch.float64)
    stacked = bmm(a, b)
    for i in range(16):
        assert torch.equal(stacked[i], bmm(a[i : i + 1].clone(), b[i : i + 1].clone())[0]), f"position {i}"

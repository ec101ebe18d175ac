"""Posterior summaries name regression weights by the stream's columns (issue 14): the covariate axis of each
weight parameter and one label per entry along it."""

from __future__ import annotations

import torch

from models import make_family
from workers.engine import posterior_summary


def summary(family: str, params: dict) -> dict:
    fam = make_family(family, params)
    theta = torch.randn(6, fam.space.dim, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    return posterior_summary(fam, theta, torch.zeros(6, dtype=torch.float64), 0)["parameters"]


def test_named_columns_label_the_weights_in_the_models_order():
    cols = ["age", "bmi", "bp"]
    s = summary("linear_regression", {"features": ["bp", "age"], "columns": cols})
    assert s["w"]["covariates"] == {"axis": 0, "names": ["bp", "age"]}
    assert s["w"]["shape"] == [2] and "covariates" not in s["b"]


def test_unnamed_columns_are_labelled_by_their_stream_index():
    s = summary("logistic_regression", {"features": [2, 0], "columns": 3, "classes": 2})
    assert s["W"]["covariates"] == {"axis": 1, "names": ["x[2]", "x[0]"]} and s["W"]["shape"] == [2, 2]
    s = summary("bnn", {"features": 2, "hidden": [3], "outputs": 1})
    assert s["W0"]["covariates"] == {"axis": 1, "names": ["x[0]", "x[1]"]}
    assert "covariates" not in s["W1"]


def test_families_without_covariates_have_no_labels():
    s = summary("gmm", {"dim": 1, "components": 2})
    assert all("covariates" not in v for v in s.values())

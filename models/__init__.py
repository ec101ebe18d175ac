"""Model families: what a model IS (DESIGN.md §4)."""

from __future__ import annotations

import os
from typing import Any

# Bits that do not depend on the stack (STYLE.md, determinism): MKL's batched matrix product takes another
# code path for every second matrix of a batch (measured on AMD EPYC, MKL in torch 2.13: bmm(a, b)[i] differs
# from bmm(a[i:i+1], b[i:i+1]) in the last bits for odd i, shapes [7, 500] @ [500, 7] and others), so a model
# stacked second would not reproduce its run alone.  Conditional Numerical Reproducibility in strict mode
# (Intel, "MKL_CBWR" environment variable) makes the result independent of the position; no cost measured
# (bench numbers in models/densities.py).  Read at MKL's first call: importing this package first is enough.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

from models.autoregressive import Autoregressive
from models.base import Family, HyperParams, ObservationError, ParameterSpace, ParameterSpec
from models.bnn import BayesianNeuralNetwork
from models.gmm import GaussianMixture
from models.linear_regression import LinearRegression
from models.logistic_regression import LogisticRegression

FAMILIES: dict[str, type[Family]] = {
    cls.name: cls
    for cls in (LinearRegression, LogisticRegression, GaussianMixture, Autoregressive, BayesianNeuralNetwork)
}


class UnknownFamilyError(KeyError):
    pass


def make_family(name: str, params: dict[str, Any] | None = None) -> Family:
    """Instantiate a family by name.

    Raises
    ------
    UnknownFamilyError
        If ``name`` is not a registered family.
    pydantic.ValidationError
        If ``params`` do not match the family's hyperparameter schema.
    """
    try:
        cls = FAMILIES[name]
    except KeyError:
        raise UnknownFamilyError(name) from None
    return cls(params)


__all__ = [
    "FAMILIES",
    "Family",
    "HyperParams",
    "ObservationError",
    "ParameterSpec",
    "ParameterSpace",
    "UnknownFamilyError",
    "make_family",
]

"""``workers.worker.restore.fresh_engines``: engines built together are the engines built alone, bit for bit."""

from __future__ import annotations

import torch

from workers.segmented import SegmentedEngine
from workers.worker.restore import changepoint_settings, fresh_engines

CFGS = [
    {"family": "gmm", "params": {"dim": 1, "components": 1}, "sampler": {"seed": 4}},
    {"family": "autoregressive", "params": {"order": 1}, "sampler": {"seed": 5, "particles": 20}},
    {"family": "gmm", "params": {"dim": 1, "components": 1}, "sampler": {"seed": 6}},
    {"family": "linear_regression", "params": {"features": 2}, "sampler": {"seed": 7, "device": "nonsense"}},
    {"family": "gmm", "params": {"dim": 1, "components": 1, "mean_scale": 3.0}, "sampler": {"seed": 8}},
]


def test_engines_built_together_are_the_engines_built_alone_and_a_bad_config_is_its_own_error():
    together = fresh_engines(CFGS)
    assert isinstance(together[3], ValueError)  # the bad device, refused for that config alone
    for cfg, eng in zip(CFGS, together, strict=True):
        if isinstance(eng, Exception):
            continue
        alone = SegmentedEngine.create(cfg["family"], cfg["params"], cfg["sampler"], changepoint_settings(cfg))
        assert eng.to_bytes() == alone.to_bytes()
        assert eng.changepoint_bytes() == alone.changepoint_bytes()
        y = torch.tensor([0.3, -1.2, 0.8, 2.0, 0.1], dtype=torch.float64)
        a, b = eng.update(None, y), alone.update(None, y)  # and they go on alike (their generators too)
        assert repr(a) == repr(b) and eng.to_bytes() == alone.to_bytes()

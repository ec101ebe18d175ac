"""The stacked kernel: a model's trace is the same bits alone (a stack of one) or in any stack,
in any order, and after a checkpoint restored into another stack composition (DESIGN.md §9)."""

from __future__ import annotations

import pytest
import torch

from models.stack import StackedFamily
from workers.engine import ModelEngine
from workers.stacking import advance_stack, stack_key

D64 = torch.float64
# warm-up crossing (12 -> 6 particles at 100 observations), re-anchoring, Fisher caps, resampling
SMALL = {
    "particles": 6,
    "warmup_particles": 12,
    "warmup_observations": 100,
    "burn_in": 3,
    "batch_size": 40,
    "block_size": 50,
}
CHUNKS = [(0, 30), (30, 130), (130, 200), (200, 260)]


def _stream(kind: str, seed: int) -> tuple[torch.Tensor | None, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    if kind == "lr":
        x = torch.randn(260, 3, generator=g, dtype=D64)
        return x, x @ torch.tensor([0.5, -1.0, 0.3], dtype=D64) + torch.randn(260, generator=g, dtype=D64)
    if kind == "ar":
        y = torch.zeros(260, dtype=D64)
        for t in range(1, 260):
            y[t] = 0.7 * y[t - 1] + 0.5 * float(torch.randn((), generator=g, dtype=D64))
        return None, y
    return None, 1.5 * torch.randn(260, generator=g, dtype=D64) + 1.0  # gmm


# (name, family, params, sampler overrides, stream kind, stream seed)
MODELS = [
    ("lr-a", "linear_regression", {"features": 3}, {"seed": 1}, "lr", 0),
    ("lr-b", "linear_regression", {"features": 3, "prior_std": 2.0, "noise_std": 0.8}, {"seed": 2}, "lr", 0),
    ("lr-c", "linear_regression", {"features": 3}, {"seed": 3, "learning_rate": 0.05, "burn_in": 5}, "lr", 1),
    ("gmm-a", "gmm", {"dim": 1, "components": 1}, {"seed": 4}, "gmm", 2),
    ("gmm-b", "gmm", {"dim": 1, "components": 1, "variance_shape": 2.0, "mean_scale": 1.0}, {"seed": 5}, "gmm", 2),
    ("gmm-c", "gmm", {"dim": 1, "components": 1, "variance_scale": 0.5}, {"seed": 6, "ess_target": 0.7}, "gmm", 3),
    ("ar-a", "autoregressive", {"order": 1}, {"seed": 7, "reanneal_steps": 2}, "ar", 4),
    ("ar-b", "autoregressive", {"order": 1, "variance_shape": 3.0}, {"seed": 8}, "ar", 4),
    ("lr-nig-a", "linear_regression", {"features": 3, "noise_std": None}, {"seed": 9}, "lr", 0),
    # mixtures (the first two take their exact history until it outgrows their batch of 100)
    ("mix-a", "gmm", {"dim": 1, "components": 2}, {"seed": 11, "batch_size": 100}, "gmm", 2),
    (
        "mix-b",
        "gmm",
        {"dim": 1, "components": 2, "dirichlet_alpha": 2.0, "variance_scale": 0.5},
        {"seed": 12, "batch_size": 100},
        "gmm",
        3,
    ),
    ("mix-c", "gmm", {"dim": 1, "components": 3}, {"seed": 13}, "gmm", 3),
    (
        "lr-nig-b",
        "linear_regression",
        {"features": 3, "noise_std": None, "weight_variance_ratio": 4.0, "intercept_location": 1.0},
        {"seed": 10},
        "lr",
        1,
    ),
]
BY_NAME = {m[0]: m for m in MODELS}


def _engine(name: str) -> ModelEngine:
    _, family, params, sampler, _, _ = BY_NAME[name]
    return ModelEngine(family, params, {**SMALL, **sampler})


def _chunk(name: str, a: int, b: int) -> tuple[torch.Tensor | None, torch.Tensor]:
    x, y = _stream(*BY_NAME[name][4:])
    return (x[a:b] if x is not None else None), y[a:b]


def _fingerprint(e: ModelEngine) -> tuple:
    s = e.state
    return (
        s.theta.clone(),
        s.log_w.clone(),
        s.velocity.clone(),
        s.anchor_grad.clone(),
        e.generator.get_state().clone(),
        s.n_reanneal,
    )


def _same(a: tuple, b: tuple) -> bool:
    return all(torch.equal(u, v) if isinstance(u, torch.Tensor) else u == v for u, v in zip(a, b, strict=True))


def _alone(name: str, chunks=CHUNKS) -> tuple[list, tuple]:
    e = _engine(name)
    infos = [i for a, b in chunks for i in e.update(*_chunk(name, a, b))]
    return infos, _fingerprint(e)


@pytest.fixture(scope="module")
def alone() -> dict[str, tuple[list, tuple]]:
    return {name: _alone(name) for name in BY_NAME}


@pytest.mark.parametrize(
    "names",
    [
        ["lr-a", "lr-b"],
        ["lr-b", "lr-a", "lr-c"],  # another order, a different stream and per-model learning rate and burn-in
        ["gmm-c", "gmm-a", "gmm-b"],  # different priors in one stack
        ["ar-b", "ar-a"],  # one re-anneals, the other does not
        ["lr-nig-b", "lr-nig-a"],  # unknown noise (normal–inverse-gamma), different priors
        ["mix-b", "mix-c", "mix-a"],  # mixtures: two of 2 components (different priors, one stack), one of 3
        [m[0] for m in MODELS],  # three families in one call: three stacks
        list(reversed([m[0] for m in MODELS])),
    ],
)
def test_alone_and_stacked_are_bit_identical(alone, names: list[str]) -> None:
    engines = [_engine(n) for n in names]
    got: dict[str, list] = {n: [] for n in names}
    for a, b in CHUNKS:
        for n, res in zip(names, advance_stack(engines, [_chunk(n, a, b) for n in names]), strict=True):
            assert isinstance(res, list), res
            got[n] += res
    for n, e in zip(names, engines, strict=True):
        assert got[n] == alone[n][0], n
        assert _same(_fingerprint(e), alone[n][1]), n
    if "ar-a" in names:
        assert any(i.reannealed for i in got["ar-a"])


def test_stack_key_follows_replaced_settings_and_reads_every_shared_field() -> None:
    """The key kept on a model is recomputed when its settings object is replaced (a challenger's ESS target, a
    confirmed challenger's settings), and it holds every setting outside PER_MODEL_SETTINGS, as a model_dump would."""
    from workers.stacking import PER_MODEL_SETTINGS, _settings_key

    a, b = _engine("gmm-a"), _engine("gmm-b")
    assert stack_key(a) == stack_key(b)
    a.settings = a.settings.model_copy(update={"batch_size": a.settings.batch_size + 1})
    assert stack_key(a) != stack_key(b)
    a.settings = a.settings.model_copy(update={"batch_size": b.settings.batch_size, "seed": 999, "learning_rate": 0.05})
    assert stack_key(a) == stack_key(b)  # the seed and the per-model settings may differ within a stack
    s = a.settings
    dumped = tuple(sorted((k, v) for k, v in s.model_dump().items() if k not in PER_MODEL_SETTINGS))
    assert _settings_key(s) == (dumped, str(s.torch_dtype), str(s.torch_device))


def test_put_keeps_the_fields_a_step_left_unchanged() -> None:
    """StackState.put copies a sub-stack's changed fields into their rows and keeps, uncopied, the ones the step
    returned as selected (workers.stacking then keeps each model's own tensor for them)."""
    from workers.sgais import StackState

    g = torch.Generator().manual_seed(0)
    K, M, D = 4, 3, 2
    full = StackState(*(torch.randn(*shape, generator=g, dtype=D64) for shape in
                        [(K, M, D), (K, M), (K, M, D), (K, M, D), (K, M, D), (K, D), (K,)]))  # fmt: skip
    idx = torch.tensor([1, 3])
    picked = full.select(idx)
    sub = picked._replace(theta=picked.theta + 1.0, log_w=picked.log_w - 1.0)
    out = full.put(idx, sub, picked)
    for name in ("velocity", "anchor", "anchor_grad", "posterior_var", "evidence_var"):
        assert getattr(out, name) is getattr(full, name), name
    assert torch.equal(out.theta[idx], full.theta[idx] + 1.0) and torch.equal(out.theta[[0, 2]], full.theta[[0, 2]])
    assert torch.equal(out.log_w, full.log_w.index_copy(0, idx, sub.log_w))


def test_models_of_a_stack_share_the_key_and_hyperparameters_become_rows() -> None:
    a, b, c = _engine("gmm-a"), _engine("gmm-b"), _engine("lr-a")
    assert stack_key(a) == stack_key(b) != stack_key(c)
    stack = StackedFamily([a.family, b.family], torch.float64, "cpu")
    assert stack.hp["variance_shape"].squeeze(1).tolist() == [1.0, 2.0]
    theta = torch.stack([a.state.theta[:4], b.state.theta[:4]])
    y = torch.randn(2, 7, 1, dtype=D64)
    ll = stack.log_likelihood(theta, None, y)
    lp = stack.log_prior(theta)
    for k, fam in enumerate((a.family, b.family)):
        torch.testing.assert_close(ll[k], fam.log_likelihood(theta[k], None, y[k]), rtol=0, atol=0)
        torch.testing.assert_close(lp[k], fam.log_prior(theta[k]), rtol=1e-15, atol=1e-12)


def test_a_mixture_keeps_its_bits_beside_one_whose_history_is_exact(monkeypatch) -> None:
    """Two-component mixtures take their exact history gradient while the history fits one mini-batch
    (``workers.sgais._whole_rows``) and sample it with control variates afterwards: stacked together, one of each, every
    model's trace is the bits it gets alone (alone, the first evaluates no anchors at all)."""
    import workers.sgais as sgais

    seen: list[list[bool]] = []
    real = sgais._whole_rows

    def spy(block, plan, whole, S):
        seen.append(list(whole))
        return real(block, plan, whole, S)

    monkeypatch.setattr(sgais, "_whole_rows", spy)
    g = torch.Generator().manual_seed(11)
    y = torch.where(torch.rand(200, generator=g) < 0.3, -1.5, 1.0).double() + 0.5 * torch.randn(200, generator=g)
    y = y.to(D64)

    def engines() -> list[ModelEngine]:
        mix = {"dim": 1, "components": 2}
        sampler = {**SMALL, "batch_size": 100, "moves": "every_step", "warmup_observations": 1000}  # one particle count
        return [
            ModelEngine("gmm", mix, {**sampler, "seed": 11}),
            ModelEngine("gmm", {**mix, "variance_scale": 0.5, "dirichlet_alpha": 2.0}, {**sampler, "seed": 12}),
        ]

    def run(stacked: bool) -> tuple[list, list]:
        a, b = engines()
        infos = [a.update(None, y[:120]), []]  # a's history (120) outgrows the batch (100): sampled, with anchors
        chunks = [(None, y[120:180]), (None, y[130:190])]  # b starts: its history fits the batch
        if stacked:
            for k, res in enumerate(advance_stack([a, b], chunks)):
                assert isinstance(res, list), res
                infos[k] += res
        else:
            infos[0] += a.update(*chunks[0])
            infos[1] += b.update(*chunks[1])
        return infos, [_fingerprint(a), _fingerprint(b)]

    infos, prints = run(False)
    seen.clear()
    got, got_prints = run(True)
    assert [True, False] in seen or [False, True] in seen  # the two shared a stack, one exact and one sampled
    assert got == infos
    assert all(_same(u, v) for u, v in zip(got_prints, prints, strict=True))


@pytest.mark.parametrize("include_history", [True, False])
def test_restore_in_another_stack_composition_is_bit_identical(alone, include_history: bool) -> None:
    """First half in one stack, checkpoint every model, restore, second half in other stacks."""
    first = ["lr-a", "lr-b", "gmm-a", "ar-a"]
    engines = [_engine(n) for n in first]
    for a, b in CHUNKS[:2]:
        advance_stack(engines, [_chunk(n, a, b) for n in first])
    blobs = {n: e.to_bytes(include_history=include_history) for n, e in zip(first, engines, strict=True)}
    del engines

    def restore(n: str) -> ModelEngine:
        history = None if include_history else [_chunk(n, a, b) for a, b in CHUNKS[:2]]
        return ModelEngine.from_bytes(blobs[n], history_blocks=history)

    second = [["ar-a", "lr-b"], ["gmm-a"], ["lr-a", "lr-c-fresh"]]
    for names in second:
        engines = [restore(n) if n in blobs else _engine("lr-c") for n in names]
        for a, b in CHUNKS[2:]:
            chunks = [_chunk(n if n in blobs else "lr-c", a, b) for n in names]
            advance_stack(engines, chunks)
        for n, e in zip(names, engines, strict=True):
            if n in blobs:
                assert _same(_fingerprint(e), alone[n][1]), n


def test_a_failing_model_leaves_its_stack_mates_alone(alone) -> None:
    """lr-b's third chunk is corrupt (NaN past validation): lr-b reports the error and keeps its state,
    lr-a goes on (alone in the last round) with exactly its solo bits."""
    a_eng, b_eng = _engine("lr-a"), _engine("lr-b")
    for a, b in CHUNKS[:2]:
        advance_stack([a_eng, b_eng], [_chunk("lr-a", a, b), _chunk("lr-b", a, b)])
    before = b_eng.state
    x, y = _chunk("lr-b", *CHUNKS[2])
    y = y.clone()
    y[3] = float("nan")
    res_a, res_b = advance_stack([a_eng, b_eng], [_chunk("lr-a", *CHUNKS[2]), (x, y)], validated=True)
    assert isinstance(res_a, list) and isinstance(res_b, FloatingPointError)
    assert b_eng.state is before and b_eng.observations == 130 and before.history.seen == 130
    advance_stack([a_eng], [_chunk("lr-a", *CHUNKS[3])])
    assert _same(_fingerprint(a_eng), alone["lr-a"][1])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_stack_of_1000_models_runs_on_the_gpu() -> None:
    """1,000 one-component gmm models with different priors and seeds on one stream, on the GPU."""
    g = torch.Generator().manual_seed(0)
    y = 1.5 * torch.randn(100, generator=g, dtype=D64) + 1.0
    engines = [
        ModelEngine(
            "gmm",
            {"dim": 1, "components": 1, "variance_shape": 1.0 + (k % 7) / 7, "mean_scale": 1.0 + (k % 5)},
            {**SMALL, "seed": k, "device": "cuda"},
        )
        for k in range(1000)
    ]
    for a in range(0, 100, 5):
        results = advance_stack(engines, [(None, y[a : a + 5])] * len(engines))
        assert all(isinstance(r, list) for r in results)
    one = ModelEngine("gmm", engines[3].family.params.model_dump(), {**SMALL, "seed": 3, "device": "cuda"})
    for a in range(0, 100, 5):
        one.update(None, y[a : a + 5])
    assert torch.equal(one.state.theta, engines[3].state.theta)
    assert all(e.state.theta.is_cuda for e in engines[:3])


def test_prior_populations_drawn_together_are_those_drawn_alone() -> None:
    """``init_states`` (a round's new challengers) builds each model's prior population with the bits ``init_state``
    gives it alone, in groups of different particle counts and dimensions, and a model whose prior draws are not
    finite gets its NumericalError without stopping the others."""
    from models import make_family
    from workers.settings import SamplerSettings
    from workers.sgais import NumericalError
    from workers.stacking import init_state, init_states

    specs = [
        ("gmm", {"dim": 1, "components": 1}, {"seed": 1}),
        ("autoregressive", {"order": 2}, {"seed": 2}),
        ("gmm", {"dim": 1, "components": 1, "variance_scale": 3.0}, {"seed": 3, "warmup_particles": 20}),
        ("gmm", {"dim": 1, "components": 1, "variance_scale": 1e308, "variance_shape": 0.01}, {"seed": 4}),  # overflows
        ("gmm", {"dim": 1, "components": 1, "mean_scale": 4.0}, {"seed": 5}),
    ]

    def args(i: int) -> tuple:
        family, params, sampler = specs[i]
        return torch.Generator().manual_seed(100 + i), make_family(family, params), SamplerSettings(**sampler)

    together = init_states([args(i) for i in range(len(specs))])
    assert isinstance(together[3], NumericalError)
    with pytest.raises(NumericalError):
        init_state(*args(3))
    for i in (0, 1, 2, 4):
        alone = init_state(*args(i))
        got = together[i]
        assert not isinstance(got, Exception)
        for field in ("theta", "log_w", "velocity", "anchor", "anchor_grad", "posterior_var", "evidence_var"):
            assert torch.equal(getattr(got, field), getattr(alone, field)), (i, field)
        assert got.log_evidence == alone.log_evidence and got.ess == alone.ess


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_change_point_models_run_on_the_gpu_alone_or_stacked() -> None:
    """The worker's engine on the GPU, beyond the plain gmm stack above: change-point models (challengers, their
    placement inside a block, a confirmed change) of an unknown-noise AR(2) (the closed-form Laplace start's profile
    grid, built on the CPU until session 33) and a two-component mixture, on a stream with a level shift.  Each model
    ends with the bits it gets alone, its tensors on the GPU; the posterior summary and a checkpoint restored on the
    GPU work."""
    from workers.changepoint import ChangepointSettings
    from workers.segmented import SegmentedEngine, advance_blocks

    g = torch.Generator().manual_seed(1)
    y = torch.randn(200, generator=g, dtype=D64)
    y[120:] += 4.0
    specs = [
        ("autoregressive", {"order": 2}, {**SMALL, "seed": 3, "device": "cuda"}),
        ("gmm", {"dim": 1, "components": 2}, {**SMALL, "seed": 4, "device": "cuda"}),
    ]

    def engines() -> list[SegmentedEngine]:
        return [SegmentedEngine.create(f, p, s, ChangepointSettings()) for f, p, s in specs]

    def blocks(family: str, a: int, b: int) -> tuple[None, torch.Tensor]:
        return None, (y[a:b] if family == "autoregressive" else y[a:b, None])

    stacked, alone = engines(), engines()
    for a in range(0, 200, 10):
        res = advance_blocks(stacked, [blocks(f, a, a + 10) for f, _, _ in specs])
        assert not any(isinstance(r, Exception) for r in res), res
        for e, (f, _, _) in zip(alone, specs, strict=True):
            e.update(*blocks(f, a, a + 10), validated=True)
    for s, e in zip(stacked, alone, strict=True):
        assert s.main.state.theta.is_cuda and torch.equal(s.main.state.theta, e.main.state.theta)
        assert s.log_evidence == e.log_evidence
        assert s.posterior_summary()["parameters"]
    ar = stacked[0]
    assert any(a["kind"] == "change_point" for a in ar.take_alerts())
    back = SegmentedEngine.restore(
        ar.to_bytes(include_history=False), ar.changepoint_bytes(), ChangepointSettings(), lambda: iter([(None, y)])
    )
    assert back.main.state.theta.is_cuda and torch.equal(back.main.state.theta, ar.main.state.theta)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_stack_of_gmm_prior_draws_is_each_models_own(dtype: torch.dtype) -> None:
    """``GaussianMixture.sample_priors`` (the arithmetic and the transform once for the stack) gives each model the
    bits of its own ``sample_prior``: several components and dimensions, per-model hyperparameters."""
    from models import make_family

    fams = [
        make_family(
            "gmm",
            {
                "dim": 2,
                "components": 3,
                "variance_shape": 1 + i / 3,
                "variance_scale": 0.5 + i / 7,
                "mean_scale": 1 + i,
                "dirichlet_alpha": 0.3 + i / 5,
                "mean_location": i / 3,
            },
        )  # fmt: skip
        for i in range(6)
    ]
    together = type(fams[0]).sample_priors(fams, [torch.Generator().manual_seed(i) for i in range(6)], 7, dtype)
    alone = [f.sample_prior(torch.Generator().manual_seed(i), 7, dtype) for i, f in enumerate(fams)]
    assert together.shape == (6, 7, 14)
    for i, a in enumerate(alone):
        assert torch.equal(together[i], a), i


def test_running_history_statistics_are_the_bits_of_the_whole_sum() -> None:
    """``workers.sgais._history_statistics`` sums only the rows appended since a history's kept total, in order: the
    bits of summing every row from zero (a fresh history), also after a truncation (the kept total is dropped) and
    for a model whose history is empty beside one whose is not."""
    from models import make_family
    from workers.history import History, StackBatches
    from workers.sgais import _history_statistics

    fam = StackedFamily([make_family("gmm", {"dim": 1, "components": 1})] * 2, D64, "cpu")
    g = torch.Generator().manual_seed(3)
    rows = 7.0 + 3.0 * torch.randn(90, generator=g, dtype=D64)
    kept, empty = History(), History()

    def whole(h: History) -> torch.Tensor:
        fresh = History()
        fresh.append(None, h.all_rows()[1])
        return _history_statistics(fam, StackBatches([fresh, History()], 40), [0])[0]

    for a, b in [(0, 5), (5, 10), (10, 35), (35, 40), (40, 90)]:
        kept.append(None, rows[a:b])
        got = _history_statistics(fam, StackBatches([kept, empty], 40), [0, 1])
        assert torch.equal(got[0], whole(kept)) and not got[1].any()
        assert kept.statistics_of(type(fam.family)) is not None
        if b == 40:
            kept.truncate(33)
            assert kept.statistics_of(type(fam.family)) is None
            kept.append(None, rows[33:40] + 1.0)  # other rows where the truncated ones were
            assert torch.equal(_history_statistics(fam, StackBatches([kept, empty], 40), [0])[0], whole(kept))

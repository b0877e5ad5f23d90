
import json

import pytest
import torch

from icl_ssm.ssm import hippo
from icl_ssm.ssm import scan as S
from icl_ssm.ssm.legs import legs_kernel, legs_kernel_slabs, legs_scan, legs_scan_fast, legs_scan_reference
from icl_ssm.ssm.powers import PowerCache

C = 8  # chunk used throughout, small so that every edge case is cheap
TOL = {torch.float64: 1e-9, torch.float32: 1e-4}


def close(actual, expected, dtype):
    """Relative to the result's scale: max |a - e| <= rtol * max |e|."""
    scale = expected.abs().max().clamp_min(1e-30)
    err = ((actual - expected).abs().max() / scale).item()
    assert err <= TOL[dtype], f"relative error {err:.2e} > {TOL[dtype]:.0e}"


def system(N=12, dt=0.05, method="bilinear", dtype=torch.float64):
    A, B = hippo.transition("legs", N)
    return hippo.discretize(A, B, dt, method)[0].to(dtype)


def data(B=3, T=20, H=5, N=12, G=None, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, H, generator=gen, dtype=dtype)
    shape = (N, H) if G is None else (G, N, H)
    return x, torch.randn(*shape, generator=gen, dtype=dtype) / H**0.5


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("T", [1, C - 1, C, C + 1, 10 * C + 3])
@pytest.mark.parametrize("G", [None, 3])
def test_fast_equals_paper_equals_reference(T, G, dtype):
    Abar = system(dtype=dtype)
    x, Bbar = data(T=T, G=G, dtype=dtype)
    ref = S.scan_reference(x, Bbar, Abar)
    assert ref.shape == ((3, 12) if G is None else (3, 3, 12))
    close(S.scan_paper(x, Bbar, Abar, chunk=C), ref, dtype)
    for fold in (1, 2, 4, None):
        close(S.scan_fast(x, Bbar, Abar, chunk=C, fold=fold), ref, dtype)
    close(S.scan(x, Bbar, Abar, chunk=C), ref, dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("T", [1, C - 1, C, C + 1, 10 * C + 3])
def test_all_states_fast_equals_reference(T, dtype):
    Abar = system(dtype=dtype)
    x, Bbar = data(T=T, G=2, dtype=dtype)
    ref = S.scan_reference(x, Bbar, Abar, return_states=True)
    assert ref.shape == (3, T, 2, 12)
    fast = S.scan_fast(x, Bbar, Abar, chunk=C, return_states=True)
    close(fast, ref, dtype)
    close(fast[:, -1], S.scan_fast(x, Bbar, Abar, chunk=C), dtype)


def padded_batch(lengths, where, H=5, dtype=torch.float64):
    """Sequences of the given lengths padded to the longest, plus each one alone."""
    T = max(lengths) + 2
    gen = torch.Generator().manual_seed(1)
    alone = [torch.randn(1, L, H, generator=gen, dtype=dtype) for L in lengths]
    x = torch.randn(len(lengths), T, H, generator=gen, dtype=dtype) * 100  # garbage padding
    mask = torch.zeros(len(lengths), T, dtype=torch.bool)
    for i, (L, seq) in enumerate(zip(lengths, alone)):
        if where == "right":
            pos = torch.arange(L)
        elif where == "left":
            pos = torch.arange(T - L, T)
        else:  # padding scattered in the middle
            pos = torch.cat([torch.arange(L // 2), torch.arange(T - (L - L // 2), T)])
        x[i, pos] = seq[0]
        mask[i, pos] = True
    return x, mask, alone


@pytest.mark.parametrize("where", ["right", "left", "middle"])
@pytest.mark.parametrize("impl", S.IMPLS)
def test_padded_batch_equals_each_sequence_alone(where, impl):
    Abar = system()
    x, mask, alone = padded_batch([1, C - 1, 3 * C + 2, 5 * C], where)
    _, Bbar = data(G=2)
    out = S.scan(x, Bbar, Abar, mask=mask, impl=impl, chunk=C)
    for i, seq in enumerate(alone):
        close(out[i : i + 1], S.scan_reference(seq, Bbar, Abar), torch.float64)


def test_padded_states_match_reference_and_are_zero_on_padding():
    Abar = system()
    x, mask, _ = padded_batch([2, 2 * C + 1, 4 * C], "right")
    _, Bbar = data()
    ref = S.scan_reference(x, Bbar, Abar, mask=mask, return_states=True)
    fast = S.scan_fast(x, Bbar, Abar, mask=mask, chunk=C, return_states=True)
    close(fast, ref, torch.float64)
    assert (fast[~mask] == 0).all()


def test_integer_mask_is_accepted():
    Abar = system()
    x, mask, _ = padded_batch([3, 9], "left")
    _, Bbar = data()
    torch.testing.assert_close(
        S.scan_fast(x, Bbar, Abar, mask=mask.long()), S.scan_fast(x, Bbar, Abar, mask=mask)
    )


def test_power_cache_is_reused_and_matches():
    Abar = system()
    cache = PowerCache(Abar)
    x, Bbar = data(T=5 * C)
    first = S.scan_fast(x, Bbar, cache, chunk=C)
    n_cached = len(cache._cast)
    second = S.scan_fast(x, Bbar, cache, chunk=C)
    assert len(cache._cast) == n_cached  # nothing recomputed
    torch.testing.assert_close(first, second, rtol=0, atol=0)
    close(first, S.scan_reference(x, Bbar, Abar), torch.float64)


def test_plan_fold_grows_with_work():
    assert S.plan_fold(1, 16, 576, 512) == 1
    assert S.plan_fold(1, 16384, 576, 512) == 8
    assert S.plan_fold(8, 16384, 576, 512) > S.plan_fold(1, 16384, 576, 512)
    assert S.plan_fold(64, 10**6, 8, 8) == 32
    assert S.plan_chunk(1) == 8 and S.plan_chunk(2048) == 32 and S.plan_chunk(10**6) == 32


@pytest.mark.parametrize("T", [1, 7, 100, 1000])
def test_planned_defaults_equal_reference(T):
    Abar = system()
    x, Bbar = data(T=T, G=2)
    close(S.scan(x, Bbar, Abar), S.scan_reference(x, Bbar, Abar), torch.float64)


def test_gradcheck_fast():
    Abar = system(N=4)
    x, Bbar = data(B=2, T=2 * 3 + 1, H=3, N=4, G=2)
    x.requires_grad_(True)
    Bbar.requires_grad_(True)
    for fold in (1, 2):
        assert torch.autograd.gradcheck(
            lambda x, b: S.scan_fast(x, b, Abar, chunk=3, fold=fold), (x, Bbar)
        )
    assert torch.autograd.gradcheck(
        lambda x, b: S.scan_fast(x, b, Abar, chunk=3, return_states=True), (x, Bbar)
    )


@pytest.mark.parametrize("states", [False, True])
def test_gradients_of_fast_match_reference(states):
    Abar = system()
    x, Bbar = data(T=4 * C + 5, G=2)
    _, mask, _ = padded_batch([4 * C + 5, 2 * C, 3], "right")
    grads = []
    for impl in ("reference", "fast"):
        xi, bi = x.clone().requires_grad_(True), Bbar.clone().requires_grad_(True)
        out = S.scan(xi, bi, Abar, mask=mask[:, : x.shape[1]], impl=impl, chunk=C,
                     return_states=states)
        (out * torch.linspace(-1, 1, out.shape[-1], dtype=out.dtype)).sum().backward()
        grads.append((xi.grad, bi.grad))
    for g_ref, g_fast in zip(*grads):
        close(g_fast, g_ref, torch.float64)


# --- one transition per group, differentiable in it (a learned dt) ---------------------


@pytest.mark.parametrize("T", [1, C, C + 1, 4 * C + 3])
def test_scan_groups_equals_reference_padded_and_in_gradient(T):
    A = hippo.transition("legs", 12)[0]
    log_dt = torch.tensor([0.05, 0.3], dtype=torch.float64).log()
    x, Bbar = data(T=T, G=2)
    _, mask, _ = padded_batch([T, max(T // 2, 1), 1], "left")
    outs, grads = [], []
    for fn in (S.scan_groups_reference, lambda *a: S.scan_groups(*a, chunk=C)):
        ld = log_dt.clone().requires_grad_(True)
        Abar = hippo.discretize_steps(A, ld.exp())
        out = fn(x, Bbar, Abar, mask[:, :T])
        (out * torch.linspace(-1, 1, out.shape[-1], dtype=out.dtype)).sum().backward()
        outs.append(out)
        grads.append(ld.grad)
    close(outs[1], outs[0], torch.float64)
    close(grads[1], grads[0], torch.float64)
    assert T == 1 or (grads[0].abs() > 0).all()  # the step is learnable: its gradient is not zero
    # a group's transition is the fixed-dt one, and each row scans like the fixed-dt scan
    assert torch.allclose(hippo.discretize_steps(A, torch.tensor([0.05], dtype=torch.float64))[0],
                          system(dt=0.05), atol=1e-12)
    for g, dt in enumerate((0.05, 0.3)):
        close(outs[1][:, g], S.scan(x, Bbar[g], system(dt=dt), mask=mask[:, :T], impl="reference"), torch.float64)


def test_discretize_steps_rejects_bad_steps():
    A = hippo.transition("legs", 4)[0]
    for bad in (torch.tensor([0.1, -0.1]), torch.tensor([[0.1]]), torch.tensor([float("nan")])):
        with pytest.raises(ValueError, match="dt must be a 1-d tensor of finite steps > 0"):
            hippo.discretize_steps(A, bad)


# --- scale-invariant LegS -------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("T", [1, C - 1, C, C + 1, 10 * C + 3])
def test_legs_fast_equals_reference(T, dtype):
    x, Bbar = data(T=T, G=2, N=10, dtype=dtype)
    ref = legs_scan_reference(x.double(), Bbar.double(), method="zoh").to(dtype)
    close(legs_scan(x, Bbar, chunk=C), ref, dtype)


@pytest.mark.parametrize("L, N, start, stop", [(1, 1, 0, 1), (37, 16, 0, 37), (37, 16, 9, 20), (1700, 64, 300, 556)])
def test_legs_kernel_slabs_equal_the_reference_kernel(L, N, start, stop):
    ref = legs_kernel(L, N, start, stop)  # (C, J, N)
    slabs = legs_kernel_slabs(L, N, start, stop)  # (J, N, C)
    assert slabs.shape == (N, N, stop - start)
    torch.testing.assert_close(slabs, ref.permute(1, 2, 0), rtol=0, atol=1e-9 * ref.abs().max().item())
    assert legs_kernel_slabs(L, N, start, stop, torch.float32).dtype == torch.float32


def test_legs_padded_batch_equals_each_alone():
    x, mask, alone = padded_batch([1, C - 1, 3 * C + 2], "middle")
    _, Bbar = data(N=10)
    out = legs_scan_fast(x, Bbar, mask=mask, chunk=C)
    close(out, legs_scan_reference(x, Bbar, mask=mask), torch.float64)
    for i, seq in enumerate(alone):
        close(out[i : i + 1], legs_scan_reference(seq, Bbar), torch.float64)


def test_legs_state_is_the_legendre_projection_of_the_whole_history():
    # with the HiPPO input B, the state after T tokens is the projection of the
    # piecewise-constant input on [0, T] onto the first N shifted Legendre polynomials
    N, T = 16, 150
    _, B = hippo.transition("legs", N)
    u = torch.randn(2, T, 1, dtype=torch.float64).cumsum(1)
    state = legs_scan(u, B[:, None].clone(), chunk=C)
    edges = hippo.shifted_legendre_integral(torch.arange(T + 1, dtype=torch.float64) / T, N)
    projection = torch.einsum("bt,tn->bn", u[..., 0], edges[1:] - edges[:-1])
    close(state, projection, torch.float64)
    # and it is what reconstructs the history: the error shrinks as N grows
    assert legs_scan(u, hippo.transition("legs", 1)[1][:, None].clone()).shape == (2, 1)


def test_legs_gradients_flow():
    x, Bbar = data(T=2 * C + 1, N=6, H=3)
    x.requires_grad_(True)
    Bbar.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x, b: legs_scan_fast(x, b, chunk=C), (x, Bbar))


@pytest.mark.parametrize("method", hippo.METHODS)
def test_legs_reference_states_end_in_final_state(method):
    x, Bbar = data(T=C + 3, N=6)
    states = legs_scan(x, Bbar, impl="reference", method=method, return_states=True)
    final = legs_scan(x, Bbar, impl="reference", method=method)
    torch.testing.assert_close(states[:, -1], final)


# --- bad input --------------------------------------------------------------------------


def bad_cases():
    Abar = system(N=4)
    x, Bbar = data(B=2, T=6, H=3, N=4)
    nan_x = x.clone()
    nan_x[1, 2, 0] = float("nan")
    inf_b = Bbar.clone()
    inf_b[0, 0] = float("inf")
    return [
        ("T = 0", lambda: S.scan(x[:, :0], Bbar, Abar), "T = 0"),
        ("x nan", lambda: S.scan(nan_x, Bbar, Abar), "x has 1 non-finite"),
        ("Bbar inf", lambda: S.scan(x, inf_b, Abar, impl="reference"), "Bbar has 1 non-finite"),
        ("x 2-D", lambda: S.scan(x[0], Bbar, Abar), "x must be a (batch, T, H) tensor, got (6, 3)"),
        ("x int", lambda: S.scan(x.long(), Bbar, Abar), "floating-point"),
        ("H mismatch", lambda: S.scan(x, Bbar[:, :2], Abar), "must equal x's H = 3"),
        ("N mismatch", lambda: S.scan(x, Bbar, system(N=5), impl="reference"), "Abar must be (N, N) = (4, 4)"),
        ("N = 0", lambda: S.scan(x, Bbar[:0], Abar), "N >= 1"),
        ("mask shape", lambda: S.scan(x, Bbar, Abar, mask=torch.ones(2, 5, dtype=torch.bool)),
         "mask must be (batch, T) = (2, 6), got (2, 5)"),
        ("mask values", lambda: S.scan(x, Bbar, Abar, mask=torch.full((2, 6), 2)), "bool or 0/1"),
        ("dtype mix", lambda: S.scan(x, Bbar.float(), Abar), "must match x's dtype"),
        ("impl", lambda: S.scan(x, Bbar, Abar, impl="cuda"), "impl must be one of"),
        ("chunk", lambda: S.scan(x, Bbar, Abar, chunk=0), "chunk must be a positive integer, got 0"),
        ("paper states", lambda: S.scan(x, Bbar, Abar, impl="paper", return_states=True), "final states only"),
        ("legs bilinear fast", lambda: legs_scan(x, Bbar, method="bilinear"), "method='zoh'"),
        ("legs method", lambda: legs_scan(x, Bbar, method="foh"), "method must be one of"),
        ("cache", lambda: PowerCache(torch.ones(3, 4)), "square (N, N)"),
    ]


@pytest.mark.parametrize("name, call, message", bad_cases(), ids=[c[0] for c in bad_cases()])
def test_bad_input_is_a_clear_value_error(name, call, message):
    with pytest.raises(ValueError) as err:
        call()
    assert message in str(err.value)


def test_failed_call_leaves_cache_usable():
    Abar = system()
    cache = PowerCache(Abar)
    x, Bbar = data(T=3 * C)
    before = S.scan_fast(x, Bbar, cache, chunk=C)
    with pytest.raises(ValueError):
        S.scan_fast(x, Bbar, cache, chunk=C, mask=torch.ones(1, 1, dtype=torch.bool))
    torch.testing.assert_close(S.scan_fast(x, Bbar, cache, chunk=C), before, rtol=0, atol=0)


def test_folded_weights_are_cached_only_without_gradients():
    Abar = system()
    cache = PowerCache(Abar)
    x, Bbar = data(T=40)
    with torch.no_grad():
        W1 = cache.folded(Bbar, 4)
        assert cache.folded(Bbar, 4) is W1  # same tensor, unmodified: reused
        Bbar.mul_(2)  # in-place change bumps the version: recomputed
        W2 = cache.folded(Bbar, 4)
        assert W2 is not W1
        torch.testing.assert_close(W2, 2 * W1)
        assert cache.folded(Bbar.clone(), 4) is not W2  # another tensor: recomputed
    p = Bbar.clone().requires_grad_(True)
    assert cache.folded(p, 4) is not cache.folded(p, 4)  # training: always fresh, differentiable
    assert cache.folded(p, 4).requires_grad


@pytest.mark.parametrize("impl", S.IMPLS)
def test_nan_in_padding_is_ignored_but_nan_in_tokens_is_an_error(impl):
    Abar = system()
    x, mask, alone = padded_batch([3, 2 * C], "right")
    _, Bbar = data()
    x[~mask] = float("nan")
    out = S.scan(x, Bbar, Abar, mask=mask, impl=impl, chunk=C)
    close(out[:1], S.scan_reference(alone[0], Bbar, Abar), torch.float64)
    x[0, 1, 0] = float("inf")
    with pytest.raises(ValueError, match="x has 1 non-finite values"):
        S.scan(x, Bbar, Abar, mask=mask, impl=impl, chunk=C)


def test_overflow_is_reported():
    Abar = system(dtype=torch.float32)
    x, Bbar = data(T=3 * C, dtype=torch.float32)
    with pytest.raises(ValueError, match="overflowed"):
        S.scan(x * 1e30, Bbar * 1e30, Abar)


def test_bench_legs_kernel_reports_agreement_and_times(capsys):
    from icl_ssm.cli import main

    assert main(["bench", "legs-kernel", "--T", "90", "--N", "8", "--H", "6", "--chunk", "32", "--batch", "3",
                 "--repeats", "1"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["max_rel_diff"] < 1e-9
    assert result["kernel_chunks_per_step"] == 3 * 3 and result["seconds_scan_step"] > 0

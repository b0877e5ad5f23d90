
import math

import pytest
import torch

from icl_ssm.ssm import hippo

f64 = torch.float64


@pytest.mark.parametrize("N", [1, 2, 7, 64])
def test_legs_matches_appendix_formula(N):
    A, B = hippo.transition("legs", N)
    assert A.dtype == f64 and A.shape == (N, N) and B.shape == (N,)
    for p in range(N):
        assert B[p].item() == pytest.approx(math.sqrt(2 * p + 1), rel=1e-15)
        for q in range(N):
            if p > q:
                expected = -math.sqrt((2 * p + 1) * (2 * q + 1))
            elif p == q:
                expected = -(p + 1)
            else:
                expected = 0.0
            assert A[p, q].item() == pytest.approx(expected, rel=1e-15, abs=0)


def test_legs_eigenvalues_are_minus_one_to_minus_n():
    A, _ = hippo.transition("legs", 12)
    eig = torch.linalg.eigvals(A).real.sort().values
    torch.testing.assert_close(eig, -torch.arange(12, 0, -1, dtype=f64), rtol=0, atol=1e-9)


@pytest.mark.parametrize("method", hippo.METHODS)
@pytest.mark.parametrize("dt", [1e-4, 1 / 400, 0.1, 1.0, 10.0])
def test_time_invariant_discretisation_is_stable(method, dt):
    A, B = hippo.transition("legs", 32)
    Abar, Bbar = hippo.discretize(A, B, dt, method)
    radius = torch.linalg.eigvals(Abar).abs().max().item()
    assert radius < 1
    assert Bbar.shape == B.shape and torch.isfinite(Bbar).all()


def test_zoh_spectral_radius_is_exp_minus_dt():
    # the paper's dt = 1 forgets fast: the slowest mode decays by e^-1 per token
    A, B = hippo.transition("legs", 16)
    Abar, _ = hippo.discretize(A, B, 1.0, "zoh")
    radius = torch.linalg.eigvals(Abar).abs().max().item()
    assert radius == pytest.approx(math.exp(-1), rel=1e-9)


@pytest.mark.parametrize("method", hippo.METHODS)
def test_small_dt_agrees_with_euler(method):
    A, B = hippo.transition("legs", 8)
    dt = 1e-6
    Abar, Bbar = hippo.discretize(A, B, dt, method)
    torch.testing.assert_close(Abar, torch.eye(8, dtype=f64) + dt * A, rtol=0, atol=1e-9)
    torch.testing.assert_close(Bbar, dt * B, rtol=0, atol=1e-9)


@pytest.mark.parametrize("method", hippo.METHODS)
def test_matrix_input_discretises_column_by_column(method):
    A, B = hippo.transition("legs", 6)
    M = torch.randn(6, 3, dtype=f64)
    _, Mbar = hippo.discretize(A, M, 0.3, method)
    for h in range(3):
        _, col = hippo.discretize(A, M[:, h], 0.3, method)
        torch.testing.assert_close(Mbar[:, h], col)


@pytest.mark.parametrize("method", hippo.METHODS)
def test_scale_invariant_steps_are_stable(method):
    A, _ = hippo.transition("legs", 24)
    Abar, Gamma = hippo.discretize_legs(A, 50, method)
    assert Abar.shape == (50, 24, 24) and Gamma.shape == (50, 24, 24)
    radii = torch.linalg.eigvals(Abar).abs().max(dim=-1).values
    assert (radii < 1).all()


def test_zoh_legs_steps_compose_to_dilations():
    # exp(A log(T/s)) is the dilation by s/T: the product of zoh steps s+1..T equals it
    N, T, s = 10, 40, 13
    A, _ = hippo.transition("legs", N)
    Abar, _ = hippo.discretize_legs(A, T, "zoh")
    prod = torch.eye(N, dtype=f64)
    for k in range(s, T):  # steps s+1 .. T
        prod = Abar[k] @ prod
    torch.testing.assert_close(prod, hippo.legs_dilation(s / T, N), rtol=0, atol=1e-12)
    torch.testing.assert_close(
        hippo.legs_dilation(0.3, N), torch.linalg.matrix_exp(A * math.log(1 / 0.3)),
        rtol=0, atol=1e-12,
    )


def test_shifted_legendre_is_orthonormal_and_integrates():
    z, w = hippo.gauss_legendre(20)
    E = hippo.shifted_legendre(z, 20)
    torch.testing.assert_close((E.T * w) @ E, torch.eye(20, dtype=f64), rtol=0, atol=1e-12)
    # E_n(y) = int_0^y e_n, checked with Gauss quadrature on [0, y]
    y = 0.37
    Ei = hippo.shifted_legendre_integral(torch.tensor(y, dtype=f64), 20)
    quad = (hippo.shifted_legendre(y * z, 20) * (y * w)[:, None]).sum(0)
    torch.testing.assert_close(Ei, quad, rtol=0, atol=1e-12)


@pytest.mark.parametrize("T,N", [(1, 1), (16, 16), (100, 7), (257, 64)])
def test_discrete_legendre_basis_is_orthonormal(T, N):
    Q = hippo.legendre_basis(T, N)
    assert Q.shape == (T, N)
    torch.testing.assert_close(Q.T @ Q, torch.eye(N, dtype=f64), rtol=0, atol=1e-10)
    # degree 0 is the constant vector with a positive sign
    torch.testing.assert_close(Q[:, 0], torch.full((T,), 1 / math.sqrt(T), dtype=f64))


def test_basis_spans_low_degree_polynomials():
    T = 50
    t = torch.linspace(-1, 1, T, dtype=f64)
    cubic = (3 * t**3 - t + 0.5)[:, None]
    torch.testing.assert_close(hippo.legendre_projection(cubic, 4), cubic, rtol=0, atol=1e-10)
    assert hippo.tail_energy(cubic, 4).item() < 1e-20


@pytest.mark.parametrize("N", [1, 3, 10, 29])
def test_proposition_1_tail_energy_equals_projection_error(N):
    gen = torch.Generator().manual_seed(N)
    x = torch.randn(2, 30, 5, generator=gen, dtype=f64).cumsum(dim=1)  # smooth-ish "KV"
    err = (x - hippo.legendre_projection(x, N)).pow(2).sum(dim=(-2, -1))
    torch.testing.assert_close(hippo.tail_energy(x, N), err, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: hippo.transition("legs", 0), "N must be a positive integer, got 0"),
        (lambda: hippo.transition("legs", -3), "got -3"),
        (lambda: hippo.transition("legt", 4), "measure must be one of"),
        (lambda: hippo.discretize(*hippo.transition("legs", 4), 0.0), "dt must be a finite number > 0, got 0.0"),
        (lambda: hippo.discretize(*hippo.transition("legs", 4), -1), "got -1"),
        (lambda: hippo.discretize(*hippo.transition("legs", 4), float("nan")), "got nan"),
        (lambda: hippo.discretize(*hippo.transition("legs", 4), 0.1, "euler"), "method must be one of"),
        (lambda: hippo.discretize(torch.eye(3), torch.ones(4), 0.1), "A must be (N, N)"),
        (lambda: hippo.discretize_legs(torch.eye(3), 0), "T must be a positive integer, got 0"),
        (lambda: hippo.legendre_basis(3, 5), "N must be <= T"),
        (lambda: hippo.legs_dilation(1.5, 4), "r must be in [0, 1]"),
    ],
)
def test_bad_input_names_argument_and_value(call, message):
    with pytest.raises(ValueError) as err:
        call()
    assert message in str(err.value)

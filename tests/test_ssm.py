"""The compressor's SSM layer: P independent LegS memories per group (``channels``) equal the
block-diagonal transition they stand for, on both systems and with a learned step."""

import pytest
import torch

from icl_ssm.compress.compressor import SSMCompressorConfig
from icl_ssm.ssm import hippo
from icl_ssm.ssm import scan as S
from icl_ssm.ssm.layer import HiPPOSSM
from icl_ssm.ssm.legs import legs_scan_reference


def data(B=3, T=41, H=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, H, generator=gen, dtype=torch.float64)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 30:] = False
    mask[2, :4] = False
    return x, mask


def block_diagonal(block: torch.Tensor, copies: int) -> torch.Tensor:
    return torch.block_diag(*[block] * copies)


@pytest.mark.parametrize("method", hippo.METHODS)
def test_channels_equal_the_block_diagonal_transition(method):
    x, mask = data()
    N, P, G, dt = 12, 3, 2, 0.05
    ssm = HiPPOSSM(N, x.shape[-1], G, dt=dt, method=method, channels=P).double()
    A, B = hippo.transition("legs", N // P)
    Abar, _ = hippo.discretize(A, B, dt, method)
    ref = S.scan(x, ssm.Bbar.detach(), block_diagonal(Abar, P).to(x.dtype), mask, impl="reference")
    torch.testing.assert_close(ssm(x, mask), ref)
    # one channel is the paper's layout: the full LegS of size N
    one = HiPPOSSM(N, x.shape[-1], G, dt=dt, method=method).double()
    A, B = hippo.transition("legs", N)
    full = S.scan(x, one.Bbar.detach(), hippo.discretize(A, B, dt, method)[0].to(x.dtype), mask, impl="reference")
    torch.testing.assert_close(one(x, mask), full)


def test_scale_invariant_channels_are_independent_legs_memories():
    x, mask = data(T=70)
    N, P, G = 8, 4, 2
    ssm = HiPPOSSM(N, x.shape[-1], G, system="scale_invariant", channels=P).double()
    out = ssm(x, mask)  # (B, G, N)
    for g in range(G):
        for p in range(P):
            block = slice(p * (N // P), (p + 1) * (N // P))
            ref = legs_scan_reference(x, ssm.Bbar.detach()[g, block], mask)
            torch.testing.assert_close(out[:, g, block], ref)
    # with a memory of one coefficient the state is the running mean of each projection
    mean = HiPPOSSM(3, x.shape[-1], 1, system="scale_invariant", channels=3).double()
    avg = (x * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    torch.testing.assert_close(mean(x, mask)[:, 0], avg @ mean.Bbar.detach()[0].T)


def test_learned_step_with_channels_matches_the_fixed_step_and_gets_a_gradient():
    x, mask = data()
    fixed = HiPPOSSM(8, x.shape[-1], 2, dt=0.1, channels=2).double()
    learned = HiPPOSSM(8, x.shape[-1], 2, dt=0.1, channels=2, learn_dt=True).double()
    torch.testing.assert_close(learned(x, mask), fixed(x, mask), rtol=1e-5, atol=1e-5)  # as for one channel
    learned(x, mask).pow(2).sum().backward()
    assert learned.log_dt.grad is not None and learned.log_dt.grad.abs().min() > 0


@pytest.mark.parametrize("channels", [0, 5, -1, True])
def test_channels_must_divide_the_state(channels):
    with pytest.raises(ValueError, match="channels must be a positive divisor of state_size=16"):
        HiPPOSSM(16, 4, 1, channels=channels)
    with pytest.raises(ValueError, match="channels must be a positive divisor"):
        SSMCompressorConfig(state_size=16, channels=channels)


def test_shift_products_match_the_loop_over_positions_and_lags():
    from icl_ssm.ssm.products import ShiftProducts, shift_products_reference

    torch.manual_seed(0)
    module = ShiftProducts(6, 5, window=3).double()
    with torch.no_grad():
        module.taps.normal_()
    x = torch.randn(2, 9, 6, dtype=torch.float64)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 6:] = False
    for m in (None, mask):
        torch.testing.assert_close(module(x, m), shift_products_reference(module, x, m))
    out = module(x, mask)
    assert out.shape == (2, 9, 5) and out[:, 0].abs().max() == 0  # nothing before the first token
    changed = x.clone()
    changed[:, 4] += torch.randn(6, dtype=torch.float64)  # moves its own products and the next 3 tokens'
    diff = (module(changed, mask) - out).abs().amax(-1)
    assert diff[:, :4].max() == 0 and diff[:, 8].max() == 0 and (diff[0, 4:8] > 1e-6).all()


def test_shift_products_start_as_the_product_with_the_previous_token():
    """The untrained filter is a shift by one: at a label token, the product of the label with
    its input, whose sign flips with the label; a state of the embeddings alone holds no such
    term."""
    from icl_ssm.ssm.products import ShiftProducts

    module = ShiftProducts(4, 3, window=2).double()
    x = torch.randn(1, 5, 4, dtype=torch.float64)
    k, v = module.project(x, None)
    torch.testing.assert_close(module(x)[:, 1:], k[:, :-1] * v[:, 1:])
    with pytest.raises(ValueError, match="window must be a positive integer, got 0"):
        ShiftProducts(4, 3, window=0)


def test_a_compressor_with_products_scans_them_and_trains_them():
    from icl_ssm.compress.compressor import SSMCompressor

    shape = dict(teacher_num_layers=2, num_groups=2, teacher_hidden_size=8, state_size=8, num_virtual=2,
                 num_sink=1, latent_size=4)
    comp = SSMCompressor(SSMCompressorConfig(pair_size=3, pair_window=2, **shape))
    assert comp.ssm.Bbar.shape == (2, 8, 8 + 3)
    x = torch.randn(2, 7, 8)
    comp(x).values.sum().backward()
    assert comp.products.taps.grad is not None and comp.products.key.weight.grad.abs().sum() > 0
    plain = SSMCompressor(SSMCompressorConfig(**shape))
    assert not hasattr(plain, "products") and plain.ssm.Bbar.shape == (2, 8, 8)
    with pytest.raises(ValueError, match="pair_window must be a positive integer, got 0"):
        SSMCompressorConfig(pair_size=3, pair_window=0, **shape)
    with pytest.raises(ValueError, match="pair_size must be >= 0, got -1"):
        SSMCompressorConfig(pair_size=-1, **shape)


def test_a_saved_compressor_keeps_its_products(tmp_path):
    from icl_ssm.compress.compressor import SSMCompressor, load_compressor

    config = SSMCompressorConfig(teacher_num_layers=2, num_groups=2, teacher_hidden_size=8, state_size=8,
                                 num_virtual=2, num_sink=1, latent_size=4, pair_size=3, pair_window=2)
    comp = SSMCompressor(config).eval()
    with torch.no_grad():
        comp.products.taps.normal_()
    comp.save_pretrained(tmp_path)
    back = load_compressor(tmp_path)
    x = torch.randn(1, 6, 8)
    with torch.no_grad():
        torch.testing.assert_close(back(x).keys, comp(x).keys)
    assert back.config.pair_window == 2


def test_a_low_rank_input_makes_the_scan_read_fewer_numbers_and_cost_less():
    from icl_ssm.compress.compressor import SSMCompressor
    from icl_ssm.cost import measure

    shape = dict(teacher_num_layers=2, num_groups=2, teacher_hidden_size=32, state_size=64, num_virtual=2,
                 num_sink=1, latent_size=4, pair_size=8, system="scale_invariant", channels=16)
    full = SSMCompressor(SSMCompressorConfig(**shape)).eval()
    low = SSMCompressor(SSMCompressorConfig(input_rank=4, **shape)).eval()
    assert low.ssm.Bbar.shape == (2, 64, 4) and low.input_proj.weight.shape == (4, 40)
    x = torch.randn(2, 30, 32)
    with torch.no_grad(), measure() as a:
        full.states(x)
    with torch.no_grad(), measure() as b:
        out = low.states(x)
    assert out.shape == (2, 2, 64) and b.flops < a.flops
    low(x).keys.sum().backward()
    assert low.input_proj.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="input_rank must be >= 0, got -2"):
        SSMCompressorConfig(input_rank=-2, **shape)

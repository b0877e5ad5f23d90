"""The architecture matrix: every tiny shape of :data:`icl_ssm.lm.tiny.TINY_CONFIGS` served end to
end (exact cache == dense, the packed and scoring paths, generation, a compressed cache, one
distillation run, save/load), sliding-window layers included; prompts are longer than the
sliding shapes' window (12), and batches are padded."""

import json

import pytest
import torch
from helpers import save_tiny

from icl_ssm.cli import main
from icl_ssm.compress.cache import compressed_cache, dense_cache
from icl_ssm.compress.compressor import SSMCompressor, SSMCompressorConfig, load_compressor
from icl_ssm.compress.generate import generate_with_prefix
from icl_ssm.compress.packed import forward_packed
from icl_ssm.evaluate.fidelity import FidelityConfig, run_fidelity
from icl_ssm.lm.hf import mixed_layer_types, sliding_window
from icl_ssm.lm.logprobs import continuation_logprobs, continuation_logprobs_ref
from icl_ssm.lm.models import load_model
from icl_ssm.lm.prefix import forward_with_prefix
from icl_ssm.lm.support import validate_supported
from icl_ssm.lm.tiny import SLIDING_TINY, TINY_CONFIGS, tiny_config, tiny_model

ARCHS = list(TINY_CONFIGS)
LENGTHS = (30, 20, 9)  # the longest beyond the window, the shortest inside it


@pytest.fixture(scope="module", params=ARCHS)
def model(request):
    return tiny_model(request.param)


def prompts(model, lengths=LENGTHS, seed=0):
    gen = torch.Generator().manual_seed(seed)
    T = max(lengths)
    ids = torch.randint(5, model.config.vocab_size, (len(lengths), T), generator=gen)
    mask = torch.arange(T)[None] < torch.tensor(lengths)[:, None]
    return ids, mask


def small_compressor(model, **overrides):
    kw = dict(state_size=16, num_groups=2, num_virtual=4, num_sink=2, latent_size=8, dt=0.05)
    kw.update(overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return SSMCompressor(SSMCompressorConfig.for_teacher(model.config, **kw)).eval()


def test_the_matrix_has_the_architectures_people_run():
    assert len(ARCHS) >= 9
    assert {"llama", "qwen2", "qwen3", "mistral", "phi3", "gemma2", "gemma3", "olmo2", "granite",
            "llama3-rope"} <= set(ARCHS)
    assert [a for a in ARCHS if sliding_window(tiny_config(a))] == list(SLIDING_TINY)
    assert mixed_layer_types(tiny_config("gemma3")).count("sliding_attention") == 5  # 5:1 local:global
    assert mixed_layer_types(tiny_config("mistral")) is None  # every layer slides: one mask serves all


def test_every_shape_is_served(model):
    validate_supported(model)


def test_dense_cache_reproduces_dense_logits(model):
    ids, mask = prompts(model)
    query = torch.randint(5, model.config.vocab_size, (3, 5), generator=torch.Generator().manual_seed(1))
    qmask = torch.tensor([[1] * 5, [1] * 3 + [0] * 2, [0] * 2 + [1] * 3], dtype=torch.bool)  # right- and left-padded
    with torch.no_grad():
        logits = forward_with_prefix(model, dense_cache(model, ids, mask), query, qmask).logits
        for b, L in enumerate(LENGTHS):
            q = query[b][qmask[b]]
            dense = model(torch.cat([ids[b, :L], q])[None]).logits[0, -len(q):]
            assert (logits[b][qmask[b]] - dense).abs().max() < 1e-4


def test_packed_path_equals_each_query_after_its_prefix(model):
    ids, mask = prompts(model)
    suffixes = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14]]
    rows = [0, 0, 1, 2]
    with torch.no_grad():
        prefix = dense_cache(model, ids, mask)
        packed, _ = forward_packed(model, prefix, suffixes, rows)
        for i, (s, r) in enumerate(zip(suffixes, rows)):
            one = forward_with_prefix(model, prefix.select([r]), torch.tensor([s])).logits[0, -1]
            assert (packed[i] - one).abs().max() < 1e-4
            dense = model(torch.cat([ids[r, : LENGTHS[r]], torch.tensor(s)])[None]).logits[0, -1]
            assert (packed[i] - dense).abs().max() < 1e-4


def test_scoring_after_a_prefix_matches_the_reference(model):
    ids, mask = prompts(model)
    with torch.no_grad():
        prefix = dense_cache(model, ids, mask)
        contexts, conts = [[7, 8, 9], [10, 11], [12]], [[13, 14], [15], [16, 17, 18]]
        fast = continuation_logprobs(model, contexts, conts, prefix=prefix)
        ref = continuation_logprobs_ref(model, contexts, conts, prefix=prefix)
        dense = continuation_logprobs_ref(model, [ids[b, :L].tolist() + c for b, (L, c) in
                                                  enumerate(zip(LENGTHS, contexts))], conts)
    torch.testing.assert_close(fast, ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(fast, dense, rtol=1e-4, atol=1e-4)


def test_generate_from_the_dense_cache_equals_dense_generate(model):
    ids, mask = prompts(model)
    query = torch.randint(5, model.config.vocab_size, (3, 4), generator=torch.Generator().manual_seed(2))
    eos = model.generation_config.eos_token_id
    with torch.no_grad():
        new = generate_with_prefix(model, dense_cache(model, ids, mask), query, max_new_tokens=4, do_sample=False)
        for b, L in enumerate(LENGTHS):
            full = torch.cat([ids[b, :L], query[b]])[None]
            dense = model.generate(full, attention_mask=torch.ones_like(full), max_new_tokens=4,
                                   do_sample=False)[0, full.shape[1]:]
            assert new[b, : len(dense)].tolist() == dense.tolist()
            if len(dense) < 4:
                assert int(dense[-1]) == eos


def test_the_compressed_cache_answers_and_generates(model):
    ids, mask = prompts(model)
    comp = small_compressor(model, num_recent=3)
    query = torch.randint(5, model.config.vocab_size, (3, 4), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        cache = compressed_cache(model, comp, ids, mask)
        assert cache.length == comp.config.cache_length
        logits = forward_with_prefix(model, cache, query).logits
        assert logits.shape == (3, 4, model.config.vocab_size) and torch.isfinite(logits).all()
        new = generate_with_prefix(model, cache, query, max_new_tokens=2, do_sample=False)
    assert new.shape[0] == 3 and 1 <= new.shape[1] <= 2


def test_compressor_save_load_round_trip(tmp_path, model):
    comp = small_compressor(model)
    comp.save_pretrained(tmp_path)
    loaded = load_compressor(tmp_path, model.config)
    ids, mask = prompts(model)
    with torch.no_grad():
        a, b = compressed_cache(model, comp, ids, mask), compressed_cache(model, loaded, ids, mask)
    assert all(torch.equal(x, y) for x, y in zip(a.keys, b.keys))


@pytest.mark.parametrize("arch", ARCHS)
def test_one_distillation_runs_and_its_compressor_loads(tmp_cache, tmp_path, arch):
    teacher = save_tiny(tmp_path / arch, arch)
    out = tmp_path / "compressor"
    assert main(["distill", "--model", str(teacher), "--task", "coin_flip", "--k", "4", "--samples", "4",
                 "--queries", "2", "--group-size", "2", "--state-size", "16", "--num-virtual", "4", "--num-sink",
                 "2", "--latent-size", "8", "--stage1-epochs", "1", "--stage2-epochs", "1", "--out",
                 str(out)]) == 0
    history = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    assert history and all(torch.isfinite(torch.tensor(h.get("kl", h.get("kv", 0.0)))) for h in history)
    model, _ = load_model(str(teacher))
    load_compressor(out, model.config)


# ---------------------------------------------------------------- sliding-window layers


@pytest.mark.parametrize("arch", SLIDING_TINY)
def test_a_sliding_model_reads_back_only_as_far_as_its_layers_reach(arch):
    """The dense prompt itself, through the exact cache: tokens more than ``layers x (window - 1)``
    back change nothing in a model whose layers all slide, and change the answer of one that
    mixes in full layers."""
    model = tiny_model(arch)
    reach = model.config.num_hidden_layers * (sliding_window(model.config) - 1)
    ids, _ = prompts(model, lengths=(40,))
    other = ids.clone()
    other[0, : 39 - reach] = 5
    with torch.no_grad():
        a = forward_with_prefix(model, dense_cache(model, ids[:, :39]), ids[:, 39:]).logits
        b = forward_with_prefix(model, dense_cache(model, other[:, :39]), other[:, 39:]).logits
    if mixed_layer_types(model.config) is None:
        assert (a - b).abs().max() < 1e-6
    else:
        assert (a - b).abs().max() > 1e-4


def test_an_all_sliding_model_with_its_window_kept_exact_equals_dense():
    """Mistral's layers all slide: what the query reads lies within ``layers x (window - 1)``
    tokens, so a compressed cache that keeps that many recent tokens exact answers exactly as
    the dense prompt, whatever its (untrained) virtual tokens hold."""
    model = tiny_model("mistral")
    reach = model.config.num_hidden_layers * (sliding_window(model.config) - 1)
    comp = small_compressor(model, num_recent=reach, num_sink=2)
    ids, mask = prompts(model, lengths=(40, 34, 30))
    query = torch.randint(5, model.config.vocab_size, (3, 3), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        cache = compressed_cache(model, comp, ids, mask)
        logits = forward_with_prefix(model, cache, query).logits[:, -1]
        for b, L in enumerate((40, 34, 30)):
            dense = model(torch.cat([ids[b, :L], query[b]])[None]).logits[0, -1]
            assert (logits[b] - dense).abs().max() < 1e-4
        # one recent token fewer and the virtual tokens enter the query's reach: no longer exact
        short = compressed_cache(model, small_compressor(model, num_recent=reach - 4, num_sink=2), ids, mask)
        far = forward_with_prefix(model, short, query).logits[:, -1]
    dense0 = model(torch.cat([ids[0, :40], query[0]])[None]).logits[0, -1]
    assert (far[0] - dense0).abs().max() > 1e-3


def test_fidelity_is_reported_for_a_gemma3_shape(tmp_cache, tmp_path):
    teacher = save_tiny(tmp_path / "gemma3", "gemma3")
    model, _ = load_model(str(teacher))
    small_compressor(model, num_recent=4).save_pretrained(tmp_path / "comp")
    report = run_fidelity(FidelityConfig(model=str(teacher), task="coin_flip", k=4, subsets=3, queries=2,
                                         compressor=str(tmp_path / "comp")))
    for key in ("kl", "rel_logit_err", "acc_dense", "acc_compressed", "subset_loss_spearman"):
        assert key in report
    assert 0.0 <= report["acc_dense"] <= 1.0 and report["kl"] >= 0.0


def test_fidelity_with_the_callers_model_equals_fidelity_that_loads_its_own(tmp_cache, tmp_path):
    """``icl-ssm run`` hands its loaded model and prompt builder to the fidelity stage: the report is
    the one a standalone measurement (loading both itself) gives; a model without its builder is refused."""
    from icl_ssm.data.tasks import get_task
    from icl_ssm.lm.prompts import PromptBuilder

    teacher = save_tiny(tmp_path / "llama", "llama")
    model, tokenizer = load_model(str(teacher))
    small_compressor(model, num_recent=4).save_pretrained(tmp_path / "comp")
    config = FidelityConfig(model=str(teacher), task="coin_flip", k=4, subsets=3, queries=2,
                            compressor=str(tmp_path / "comp"))
    own = run_fidelity(config)
    builder = PromptBuilder.for_model(model, tokenizer, get_task("coin_flip"))
    held = run_fidelity(config, model=model, builder=builder)
    for key in ("kl", "rel_logit_err", "acc_dense", "acc_compressed", "subset_loss_spearman", "cache_tokens"):
        assert held[key] == pytest.approx(own[key], rel=1e-5, abs=1e-7), key
    with pytest.raises(ValueError, match="give both model and builder"):
        run_fidelity(config, model=model)

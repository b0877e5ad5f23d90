
import json

import pytest
import torch

from icl_ssm.compress.cache import PrefixCache, compressed_cache, dense_cache, window_cache
from icl_ssm.compress.compressor import SSMCompressor, SSMCompressorConfig, load_compressor, parameter_budget
from icl_ssm.compress.generate import generate_with_prefix
from icl_ssm.lm.generation import greedy_generate
from icl_ssm.lm.hf import output_cache
from icl_ssm.lm.logprobs import continuation_logprobs, continuation_logprobs_ref
from icl_ssm.lm.prefix import forward_with_prefix
from icl_ssm.lm.tiny import tiny_config, tiny_model

ARCHS = [("llama", {}), ("qwen2", {}), ("llama", {"head_dim": 24, "num_key_value_heads": 1})]


def small_compressor(model, **overrides):
    kw = dict(state_size=16, num_groups=2, num_virtual=4, num_sink=2, latent_size=8, dt=0.05)
    kw.update(overrides)
    return SSMCompressor(SSMCompressorConfig.for_teacher(model.config, **kw)).eval()


def prompts(model, lengths=(20, 13, 7), seed=0):
    gen = torch.Generator().manual_seed(seed)
    T = max(lengths)
    ids = torch.randint(5, model.config.vocab_size, (len(lengths), T), generator=gen)
    mask = torch.arange(T)[None] < torch.tensor(lengths)[:, None]
    return ids, mask


@pytest.fixture(scope="module", params=ARCHS, ids=lambda a: a[0] + "".join(f"-{k}{v}" for k, v in a[1].items()))
def model(request):
    arch, kw = request.param
    return tiny_model(arch, **kw)


def test_dense_cache_reproduces_dense_logits(model):
    ids, mask = prompts(model)
    query = torch.randint(5, model.config.vocab_size, (3, 5))
    logits = forward_with_prefix(model, dense_cache(model, ids, mask), query).logits
    for b, L in enumerate(mask.sum(1).tolist()):
        dense = model(torch.cat([ids[b, :L], query[b]])[None]).logits[0, -5:]
        torch.testing.assert_close(logits[b], dense, rtol=0, atol=1e-4)


def test_dense_cache_with_padded_query(model):
    ids, mask = prompts(model)
    query = torch.randint(5, model.config.vocab_size, (3, 6))
    qmask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [0] * 3 + [1] * 3], dtype=torch.bool)
    logits = forward_with_prefix(model, dense_cache(model, ids, mask), query, qmask).logits
    for b, L in enumerate(mask.sum(1).tolist()):
        q = query[b][qmask[b]]
        dense = model(torch.cat([ids[b, :L], q])[None]).logits[0, -len(q):]
        torch.testing.assert_close(logits[b][qmask[b]], dense, rtol=0, atol=1e-4)


def test_compressed_cache_shapes_follow_the_teacher(model):
    comp = small_compressor(model)
    ids, mask = prompts(model)
    pc = compressed_cache(model, comp, ids, mask)
    c = model.config
    hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    assert len(pc.keys) == c.num_hidden_layers
    for k, v in zip(pc.keys, pc.values):
        assert k.shape == v.shape == (3, c.num_key_value_heads, 2 + 4, hd)
    assert pc.next_position.tolist() == [6, 6, 6]
    assert pc.prompt_length.tolist() == [20, 13, 7]
    # the sinks are exactly the teacher's K/V of the first tokens
    exact = dense_cache(model, ids, mask)
    for k_c, k_e in zip(pc.keys, exact.keys):
        torch.testing.assert_close(k_c[:, :, :2], k_e[:, :, :2])


def test_original_position_convention(model):
    comp = small_compressor(model, position="original")
    ids, mask = prompts(model)
    pc = compressed_cache(model, comp, ids, mask)
    assert pc.next_position.tolist() == [20, 13, 7]


def test_batch_of_different_subsets_equals_each_alone(model):
    comp = small_compressor(model)
    ids, mask = prompts(model, lengths=(9, 17, 12))
    query = torch.randint(5, model.config.vocab_size, (3, 4))
    batched = forward_with_prefix(model, compressed_cache(model, comp, ids, mask), query).logits
    for b, L in enumerate(mask.sum(1).tolist()):
        alone = compressed_cache(model, comp, ids[b : b + 1, :L])
        torch.testing.assert_close(
            forward_with_prefix(model, alone, query[b : b + 1]).logits[0], batched[b], rtol=1e-4, atol=1e-5
        )


def test_prefix_rows_can_be_repeated_per_query(model):
    comp = small_compressor(model)
    ids, mask = prompts(model)
    pc = compressed_cache(model, comp, ids, mask)
    rep = pc.repeat_interleave(2)
    assert rep.batch_size == 6
    torch.testing.assert_close(rep.keys[0][1], pc.keys[0][0])
    query = torch.randint(5, model.config.vocab_size, (6, 3))
    out = forward_with_prefix(model, rep, query).logits
    torch.testing.assert_close(out[2], forward_with_prefix(model, pc.select([1]), query[2:3]).logits[0],
                               rtol=1e-4, atol=1e-5)


def test_generate_runs_from_compressed_and_matches_dense_from_exact(model):
    ids, mask = prompts(model)
    query = torch.randint(5, model.config.vocab_size, (3, 4), generator=torch.Generator().manual_seed(0))
    comp = small_compressor(model)
    new = generate_with_prefix(model, compressed_cache(model, comp, ids, mask), query,
                                 max_new_tokens=3, do_sample=False)
    assert new.shape == (3, 3)
    exact = generate_with_prefix(model, dense_cache(model, ids, mask), query, max_new_tokens=3, do_sample=False)
    for b, L in enumerate(mask.sum(1).tolist()):
        full = torch.cat([ids[b, :L], query[b]])[None]
        dense = model.generate(full, max_new_tokens=3, do_sample=False)[0, full.shape[1]:]
        assert torch.equal(exact[b, : len(dense)], dense)
        if len(dense) < 3:  # generate stopped at the end-of-sequence token; the batch row goes on padded
            assert int(dense[-1]) == model.generation_config.eos_token_id


def test_window_cache_keeps_sinks_and_recent_tokens(model):
    ids, mask = prompts(model)
    w = window_cache(model, ids, mask, num_sink=2, n_window=4)
    assert w.length == 6 and w.mask.all()
    # the window's K/V equal a dense pass over exactly those tokens
    kept = torch.cat([ids[1, :2], ids[1, 13 - 4 : 13]])[None]
    torch.testing.assert_close(w.keys[0][1:2], dense_cache(model, kept).keys[0])
    # a prompt shorter than the window keeps everything, padding on the left of the slots
    short = window_cache(model, ids[2:, :7], None, num_sink=2, n_window=10)
    assert short.mask.sum().item() == 7 and short.next_position.tolist() == [7]


def test_save_load_round_trip_gives_identical_virtual_kv(tmp_path, model):
    comp = small_compressor(model)
    with torch.no_grad():
        for p in comp.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    comp.save_pretrained(tmp_path)
    loaded = load_compressor(tmp_path, model.config)
    ids, mask = prompts(model)
    embeds = model.get_input_embeddings()(ids)
    a, b = comp(embeds, mask), loaded(embeds, mask)
    assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "icl_ssm_compressor"


@pytest.mark.parametrize(
    "override, field",
    [
        ({"num_hidden_layers": 3}, "num_hidden_layers: compressor has 2, model has 3"),
        ({"num_key_value_heads": 4}, "num_key_value_heads"),
        ({"head_dim": 4}, "head_dim: compressor has 8, model has 4"),
        ({"vocab_size": 77}, "vocab_size"),
    ],
)
def test_compressor_for_another_teacher_is_refused(tmp_path, override, field):
    teacher = tiny_config("llama")
    comp = SSMCompressor(SSMCompressorConfig.for_teacher(teacher, state_size=8, num_groups=1,
                                                         num_virtual=2, latent_size=4))
    comp.save_pretrained(tmp_path)
    other = tiny_config("llama", **override)
    with pytest.raises(ValueError, match=field):
        load_compressor(tmp_path, other)


def test_truncated_checkpoint_is_a_clear_error(tmp_path):
    comp = SSMCompressor(SSMCompressorConfig.for_teacher(tiny_config("llama"), state_size=8, num_groups=1,
                                                         num_virtual=2, latent_size=4))
    comp.save_pretrained(tmp_path)
    f = tmp_path / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(ValueError, match="model.safetensors.*could not be read"):
        load_compressor(tmp_path)
    with pytest.raises(ValueError, match="does not exist"):
        load_compressor(tmp_path / "nope")
    (tmp_path / "config.json").unlink()
    with pytest.raises(ValueError, match="has no config.json"):
        load_compressor(tmp_path)


def test_control_ignores_the_prompt(model):
    comp = small_compressor(model, control=True)
    with torch.no_grad():
        comp.constant.normal_()
    ids, mask = prompts(model)
    embeds = model.get_input_embeddings()(ids)
    out = comp(embeds, mask)
    torch.testing.assert_close(out.keys[:, 0], out.keys[:, 1])
    ssm = small_compressor(model)
    out = ssm(embeds, mask)
    assert not torch.allclose(out.keys[:, 0], out.keys[:, 1])


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda m, c: compressed_cache(m, c, torch.zeros(1, 0, dtype=torch.long)), "non-empty"),
        (lambda m, c: compressed_cache(m, c, torch.ones(2, 1, dtype=torch.long)),
         r"rows \[0, 1\] have \[1, 1\] tokens, fewer than num_sink=2"),
        (lambda m, c: compressed_cache(m, c, torch.ones(1, 4, dtype=torch.long),
                                         torch.tensor([[0, 1, 1, 1]])), "right-padded"),
        (lambda m, c: compressed_cache(m, c, torch.ones(1, 4, dtype=torch.long), torch.zeros(1, 4)), "empty"),
        (lambda m, c: c(torch.zeros(1, 3, 5)), "inputs_embeds must be"),
        (lambda m, c: forward_with_prefix(m, dense_cache(m, torch.ones(2, 3, dtype=torch.long)),
                                            torch.ones(3, 1, dtype=torch.long)), "must equal the prefix batch"),
    ],
)
def test_bad_input(call, message):
    m = tiny_model("llama")
    with pytest.raises(ValueError, match=message):
        call(m, small_compressor(m))


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"num_groups": 5}, "exceeds the teacher's 2 layers"),
        ({"system": "lti"}, "system must be one of"),
        ({"position": "end"}, "position must be one of"),
        ({"dt": -1.0}, "dt must be a finite number > 0"),
        ({"num_virtual": 0}, "num_virtual must be a positive integer"),
    ],
)
def test_bad_config(kw, message):
    with pytest.raises(ValueError, match=message):
        SSMCompressorConfig.for_teacher(tiny_config("llama"), **kw)


def test_parameter_budget_of_the_paper_scale_teachers():
    from transformers import LlamaConfig, Qwen2Config

    smol = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                       num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True)
    qwen = Qwen2Config(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                       num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True)
    smol_budget = parameter_budget(smol, 134_515_008)
    qwen_budget = parameter_budget(qwen, 1_543_714_304)
    assert smol_budget["param_fraction"] <= 0.10
    assert qwen_budget["param_fraction"] <= 0.05


def test_hybrid_cache_keeps_recent_tokens_on_top_of_the_summary(model):
    comp = small_compressor(model, num_recent=3)
    ids, mask = prompts(model, lengths=(9, 17, 12))
    pc = compressed_cache(model, comp, ids, mask)
    assert pc.length == 2 + 4 + 3 and pc.next_position.tolist() == [9, 9, 9]
    query = torch.randint(5, model.config.vocab_size, (3, 4))
    batched = forward_with_prefix(model, pc, query).logits
    plain = small_compressor(model)  # the same weights without the recent tokens
    plain.load_state_dict(comp.state_dict())
    for b, L in enumerate(mask.sum(1).tolist()):
        # the summary reads only the tokens before the recent ones; those are re-encoded on top
        summary = compressed_cache(model, plain, ids[b : b + 1, : L - 3])
        recent = forward_with_prefix(model, summary, ids[b : b + 1, L - 3 : L])
        for layer in (0, -1):
            torch.testing.assert_close(pc.keys[layer][b : b + 1], output_cache(recent).layers[layer].keys,
                                       rtol=1e-4, atol=1e-5)
        alone = compressed_cache(model, comp, ids[b : b + 1, :L])
        torch.testing.assert_close(forward_with_prefix(model, alone, query[b : b + 1]).logits[0], batched[b],
                                   rtol=1e-4, atol=1e-5)
    original = compressed_cache(model, small_compressor(model, num_recent=3, position="original"), ids, mask)
    assert original.next_position.tolist() == [9, 17, 12]
    with pytest.raises(ValueError, match="shorter than num_sink \\+ num_recent"):
        compressed_cache(model, small_compressor(model, num_recent=30), ids, mask)


# ---------------------------------------------------------------------------------------
# gated virtual tokens: an additive attention bias per slot, carried by the PrefixCache
# ---------------------------------------------------------------------------------------


def test_zero_bias_is_the_plain_mask(model):
    """The 4D additive mask (bias path) equals the 2D mask path, padded queries included."""
    ids, mask = prompts(model)
    plain = compressed_cache(model, small_compressor(model), ids, mask)
    biased = PrefixCache(plain.keys, plain.values, plain.mask, plain.next_position, plain.prompt_length,
                           bias=torch.zeros(plain.mask.shape))
    query = torch.randint(5, model.config.vocab_size, (3, 6))
    qmask = torch.tensor([[1] * 6, [0] * 2 + [1] * 4, [0] * 5 + [1]], dtype=torch.bool)
    a = forward_with_prefix(model, plain, query, qmask).logits
    b = forward_with_prefix(model, biased, query, qmask).logits
    torch.testing.assert_close(a[qmask], b[qmask], rtol=1e-5, atol=1e-5)
    bumped = PrefixCache(plain.keys, plain.values, plain.mask, plain.next_position, plain.prompt_length,
                           bias=torch.full(plain.mask.shape, -3.0).index_fill(1, torch.tensor([0]), 0.0))
    assert not torch.allclose(forward_with_prefix(model, bumped, query, qmask).logits[qmask], a[qmask])


def test_closed_gate_is_the_window_and_opening_it_trains(model):
    ids, mask = prompts(model, lengths=(9, 17, 12))
    query = torch.randint(5, model.config.vocab_size, (3, 4))
    closed = small_compressor(model, num_recent=3, gate=True, gate_init=-1e4)
    pc = compressed_cache(model, closed, ids, mask)
    assert pc.length == 2 + 4 + 3 and pc.next_position.tolist() == [5, 5, 5]
    assert pc.bias.shape == (3, 9) and (pc.bias[:, 2:6] == -1e4).all() and (pc.bias[:, [0, 1, 6, 7, 8]] == 0).all()
    window = window_cache(model, ids, mask, num_sink=2, n_window=3)
    torch.testing.assert_close(forward_with_prefix(model, pc, query).logits,
                               forward_with_prefix(model, window, query).logits, rtol=1e-4, atol=1e-5)
    # a gate that is open changes the answer, and the loss reaches both the gate and the head
    ajar = small_compressor(model, num_recent=3, gate=True, gate_init=0.0).train()
    logits = forward_with_prefix(model, compressed_cache(model, ajar, ids, mask), query).logits
    assert not torch.allclose(logits, forward_with_prefix(model, window, query).logits, atol=1e-3)
    logits.logsumexp(-1).sum().backward()
    assert ajar.gate_bias.grad.abs().sum() > 0 and ajar.to_kv.grad.abs().sum() > 0
    # rows of a gated cache select and repeat like any other
    rows = pc.select([2, 0, 2])
    assert torch.equal(rows.bias, pc.bias[[2, 0, 2]])


def test_gated_cache_scores_and_decodes_through_prompts(model):
    ids, mask = prompts(model, lengths=(9, 17, 12))
    comp = small_compressor(model, num_recent=3, gate=True, gate_init=-1.0)
    pc = compressed_cache(model, comp, ids, mask)
    contexts = [[7, 8, 9], [10, 11], [12]]
    conts = [[13, 14], [15], [16, 17, 18]]
    fast = continuation_logprobs(model, contexts, conts, prefix=pc)
    ref = continuation_logprobs_ref(model, contexts, conts, prefix=pc)
    torch.testing.assert_close(fast, ref, rtol=1e-4, atol=1e-4)
    # greedy decoding from the gated cache: each step's 4D mask grows with the tokens seen
    out = greedy_generate(model, contexts, prefix=pc, max_new_tokens=3)
    for b, ctx in enumerate(contexts):
        seq = list(ctx)
        for _ in range(3):
            step = forward_with_prefix(model, pc.select([b]), torch.tensor([seq])).logits[0, -1].argmax().item()
            seq.append(step)
        assert out[b] == seq[len(ctx):]
    with pytest.raises(ValueError, match="decoded greedily; got do_sample=True"):
        generate_with_prefix(model, pc, torch.ones(3, 2, dtype=torch.long), max_new_tokens=1, do_sample=True)
    with pytest.raises(ValueError, match="got num_beams"):
        generate_with_prefix(model, pc, torch.ones(3, 2, dtype=torch.long), num_beams=2)


@pytest.mark.parametrize("eos", [None, "frequent"])
def test_generate_from_a_closed_gate_equals_generate_from_the_window(model, eos):
    """The greedy path for gated caches against model.generate on the window it starts as."""
    ids, mask = prompts(model, lengths=(9, 17, 12))
    query = torch.randint(5, model.config.vocab_size, (3, 4))
    qmask = torch.tensor([[1] * 4, [0, 1, 1, 1], [0, 0, 1, 1]], dtype=torch.bool)
    gated = compressed_cache(model, small_compressor(model, num_recent=3, gate=True, gate_init=-1e4), ids, mask)
    window = window_cache(model, ids, mask, num_sink=2, n_window=3)
    kw = {"max_new_tokens": 6, "do_sample": False, "pad_token_id": 0}
    if eos == "frequent":  # the token the window's first step emits most: some rows stop early
        first = generate_with_prefix(model, window, query, qmask, max_new_tokens=1, do_sample=False)
        kw["eos_token_id"] = int(first[:, 0].mode().values)
    else:
        kw["eos_token_id"] = None
    expected = generate_with_prefix(model, window, query, qmask, **kw)
    torch.testing.assert_close(generate_with_prefix(model, gated, query, qmask, **kw), expected, rtol=0, atol=0)


def test_gate_config_is_checked():
    with pytest.raises(ValueError, match="gate_init must be a finite number"):
        SSMCompressorConfig.for_teacher(tiny_config("llama"), gate=True, gate_init=float("-inf"))
    with pytest.raises(ValueError, match="gate=False"):
        small_compressor(tiny_model("llama")).slot_bias(1)


def test_default_compressor_config_is_valid():
    # transformers instantiates the default config (e.g. to diff against when saving)
    from icl_ssm.compress.compressor import SSMCompressorConfig

    config = SSMCompressorConfig()
    assert config.num_groups <= config.teacher_num_layers


def test_an_extended_prefix_equals_the_longer_prompt():
    """prefix + what a forward after it read == the exact cache of the whole prompt."""
    model = tiny_model("llama").eval()
    torch.manual_seed(0)
    ids = torch.randint(3, 100, (2, 12))
    full = dense_cache(model, ids)
    head = dense_cache(model, ids[:, :8])
    with torch.no_grad():
        out = forward_with_prefix(model, head, ids[:, 8:])
    joined = head.extended(output_cache(out), torch.ones(2, 4, dtype=torch.bool))
    assert joined.length == 12 and joined.next_position.tolist() == [12, 12]
    for a, b in zip(joined.keys + joined.values, full.keys + full.values, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="the cache holds 12 slots; expected this prefix's 8 \\+ 3 new ones"):
        head.extended(output_cache(out), torch.ones(2, 3, dtype=torch.bool))


def test_cache_paths_use_the_installed_transformers_cache_argument():
    """No deprecated forward argument on any cache path: transformers 5.24 renamed
    ``past_key_values`` to ``cache`` and removes the old name in 5.40."""
    import warnings

    model = tiny_model("llama").eval()
    torch.manual_seed(0)
    ids = torch.randint(3, 100, (2, 10))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        prefix = dense_cache(model, ids[:, :7])
        with torch.no_grad():
            out = forward_with_prefix(model, prefix, ids[:, 7:])
        joined = prefix.extended(output_cache(out), torch.ones(2, 3, dtype=torch.bool))
        new = generate_with_prefix(model, prefix, ids[:, 7:], max_new_tokens=2, do_sample=False)
    assert joined.length == 10 and new.shape == (2, 2)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_the_ssm_can_read_the_states_after_the_first_layers(arch):
    """ssm_input="layer:l": the SSM reads the teacher's hidden states after l layers, the same
    states the full model computes there, and the cache costs those layers on top."""
    from icl_ssm.compress.cache import summary_inputs
    from icl_ssm.cost import measure
    from icl_ssm.lm.hf import hidden_after_layers

    model = tiny_model(arch, num_hidden_layers=4).eval()
    ids = torch.randint(3, 100, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[1, 9:] = False
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=mask.long(), output_hidden_states=True).hidden_states
        got = hidden_after_layers(model, model.get_input_embeddings()(ids), mask, 2)
        torch.testing.assert_close(got[mask], full[2][mask], rtol=1e-4, atol=1e-5)
        assert len(model.model.layers) == 4 and not isinstance(model.model.norm, torch.nn.Identity)  # restored
        shape = dict(state_size=8, num_virtual=2, num_sink=2, latent_size=8)
        plain = SSMCompressor(SSMCompressorConfig.for_teacher(model.config, **shape)).eval()
        deep = SSMCompressor(SSMCompressorConfig.for_teacher(model.config, ssm_input="layer:2", **shape)).eval()
        states, _ = summary_inputs(model, deep, ids, mask)
        torch.testing.assert_close(states[mask], full[2][mask], rtol=1e-4, atol=1e-5)
        with measure() as a:
            compressed_cache(model, plain, ids, mask)
        with measure() as b:
            compressed_cache(model, deep, ids, mask)
    assert b.flops > a.flops
    with pytest.raises(ValueError, match="ssm_input='layer:4'; accepted: 'embeddings' or 'layer:l' with 1 <= l < 4"):
        SSMCompressorConfig.for_teacher(model.config, ssm_input="layer:4", **shape)
    with pytest.raises(ValueError, match="layers=0: expected 1..3"):
        hidden_after_layers(model, model.get_input_embeddings()(ids), mask, 0)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_rerotated_keys_match_keys_computed_at_the_new_position(arch):
    """Reference: a layer's key projected from its input and rotated at the target position by
    the model's own apply_rotary_pos_emb; against the stored key rotated by the difference."""
    import importlib

    from icl_ssm.lm.hf import rerotate_keys

    model = tiny_model(arch).eval()
    module = importlib.import_module(type(model).__module__)
    ids = torch.randint(3, 100, (1, 10))
    with torch.no_grad():
        stored = dense_cache(model, ids).keys[0]  # (1, H, 10, d) rotated at positions 0..9
        attn, inner = model.model.layers[0].self_attn, model.model
        h = model.model.layers[0].input_layernorm(inner.embed_tokens(ids))
        raw = attn.k_proj(h).view(1, 10, -1, attn.head_dim).transpose(1, 2)  # (1, H, 10, d), not rotated
        target = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]]) - 5  # every token 5 earlier (clamped at 0 below)
        target = target.clamp(min=0)
        cos, sin = inner.rotary_emb(raw, target)
        _, want = module.apply_rotary_pos_emb(raw, raw, cos, sin)
        got = rerotate_keys(model, stored, target - torch.arange(10)[None])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("position", ["original", "compressed"])
def test_streaming_cache_keeps_the_dense_sinks_and_recent_tokens(position):
    from icl_ssm.compress.baselines import streaming_cache

    model = tiny_model("llama").eval()
    ids = torch.randint(3, 100, (2, 14))
    mask = torch.ones(2, 14, dtype=torch.bool)
    mask[1, 8:] = False
    query = torch.randint(3, 100, (2, 3))
    with torch.no_grad():
        dense = dense_cache(model, ids, mask)
        whole = streaming_cache(model, ids, mask, num_sink=2, n_window=12, position=position)  # nothing evicted
        torch.testing.assert_close(forward_with_prefix(model, whole, query).logits,
                                   forward_with_prefix(model, dense, query).logits, rtol=1e-4, atol=1e-4)
        cut = streaming_cache(model, ids, mask, num_sink=2, n_window=4, position=position)
    assert cut.keys[0].shape[2] == 6 and cut.mask.tolist() == [[True] * 6, [True] * 6]
    keep = [0, 1, 10, 11, 12, 13]  # row 0: sinks and the last 4 of 14 tokens, K/V from the whole prompt
    torch.testing.assert_close(cut.values[1][0], dense.values[1][0][:, keep])
    if position == "original":
        torch.testing.assert_close(cut.keys[1][0], dense.keys[1][0][:, keep])
        assert cut.next_position.tolist() == [14, 8]
    else:
        assert cut.next_position.tolist() == [6, 6]
        torch.testing.assert_close(cut.keys[1][0][:, :2], dense.keys[1][0][:, :2])  # the sinks do not move
    with pytest.raises(ValueError, match="position='middle'"):
        streaming_cache(model, ids, mask, 2, 4, position="middle")


def test_lm_infinite_prefills_under_the_lambda_mask():
    from icl_ssm.compress.baselines import lambda_mask, lm_infinite_cache

    mask = torch.ones(1, 6, dtype=torch.bool)
    seen = lambda_mask(mask, num_global=1, n_local=2)[0, 0] == 0
    assert seen.int().tolist() == [[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0],
                                   [1, 0, 1, 1, 0, 0], [1, 0, 0, 1, 1, 0], [1, 0, 0, 0, 1, 1]]
    from icl_ssm.compress.baselines import streaming_cache

    # two layers: a kept token's layer-2 K/V read its layer-1 state, which saw only its Lambda
    model = tiny_model("llama", num_hidden_layers=2).eval()
    ids = torch.randint(3, 100, (1, 12))
    query = torch.randint(3, 100, (1, 2))
    other = ids.clone()
    other[0, 4] = (ids[0, 4] + 1) % 100 + 3  # a token outside the last 4 and the 2 sinks
    with torch.no_grad():
        a = forward_with_prefix(model, lm_infinite_cache(model, ids, None, 2, 4), query).logits
        b = forward_with_prefix(model, lm_infinite_cache(model, other, None, 2, 4), query).logits
        torch.testing.assert_close(a, b)  # the answer does not read it, nor do the kept tokens
        dense_a = forward_with_prefix(model, streaming_cache(model, ids, None, 2, 4), query).logits
        dense_b = forward_with_prefix(model, streaming_cache(model, other, None, 2, 4), query).logits
        assert not torch.allclose(dense_a, dense_b)  # with full attention in the prefill, it is read
        whole = lm_infinite_cache(model, ids, None, 2, 12)  # the window holds every token: the dense prompt
        torch.testing.assert_close(forward_with_prefix(model, whole, query).logits,
                                   forward_with_prefix(model, dense_cache(model, ids), query).logits,
                                   rtol=1e-4, atol=1e-4)


def test_the_dense_cache_keeps_its_earlier_name():
    import icl_ssm
    from icl_ssm.compress.cache import dense_cache, exact_cache

    assert exact_cache is dense_cache and icl_ssm.exact_cache is dense_cache

"""Tests of icl_ssm.lm.prompts: exact spans, prefix/suffix split, label scoring, generation."""

from __future__ import annotations

import importlib

import pytest
import torch
from helpers import (
    MULTI_EXAMPLES,
    QA_EXAMPLES,
    SENTIMENT_EXAMPLES,
    FakeExample,
    exact_prefix,
    manual_continuation_logprob,
    multi_token_task,
    qa_task,
    sentiment_task,
    tiny_llama,
    tiny_llama3_style_tokenizer,
    tiny_qwen2,
)

from icl_ssm.data.tasks import get_task
from icl_ssm.lm.generation import generate_answers, greedy_generate
from icl_ssm.lm.hf import output_cache
from icl_ssm.lm.logprobs import continuation_logprobs, continuation_logprobs_ref
from icl_ssm.lm.prompts import Prompt, PromptBuilder
from icl_ssm.lm.scoring import answer_loss, predict_labels, score_labels
from icl_ssm.lm.tiny import tiny_model, tiny_tokenizer

TOKENIZERS = {"gpt2-style": tiny_tokenizer, "llama3-style": tiny_llama3_style_tokenizer}
TASKS = {
    "single": (sentiment_task, SENTIMENT_EXAMPLES),
    "multi": (multi_token_task, MULTI_EXAMPLES),
    "qa": (qa_task, QA_EXAMPLES),
}


@pytest.fixture(scope="module")
def tokenizers():
    return {name: make() for name, make in TOKENIZERS.items()}


@pytest.fixture(scope="module")
def llama():
    return tiny_llama()


@pytest.fixture(scope="module")
def qwen2():
    return tiny_qwen2()


def _demos_query(examples):
    return list(examples[:3]), examples[-1]


# ---------------------------------------------------------------- building


@pytest.mark.parametrize("chat", [False, True], ids=["plain", "chat"])
@pytest.mark.parametrize("task_name", list(TASKS))
@pytest.mark.parametrize("tok_name", list(TOKENIZERS))
def test_spans_are_exact_and_prefix_plus_suffix_is_whole(tokenizers, tok_name, task_name, chat):
    tokenizer = tokenizers[tok_name]
    make_task, examples = TASKS[task_name]
    builder = PromptBuilder(tokenizer, make_task(), chat=chat)
    demos, query = _demos_query(examples)
    prompt = builder.build(demos, query)

    prefix, suffix = builder.build_prefix(demos), builder.build_suffix(query)
    assert prefix.input_ids + suffix.input_ids == prompt.input_ids
    assert prompt.query_span == (len(prefix.input_ids), len(prompt.input_ids))
    assert prompt.answer_start == len(prompt.input_ids)
    assert prefix.demo_spans == prompt.demo_spans
    header = builder.build_prefix([])
    # spans tile the prompt: header | demo | demo | demo | query
    edges = [len(header.input_ids)] + [e for _, e in prompt.demo_spans]
    assert [s for s, _ in prompt.demo_spans] == edges[:-1]
    assert prompt.query_span[0] == edges[-1]
    for demo, (start, end) in zip(demos, prompt.demo_spans, strict=True):
        # a demonstration tokenises the same wherever it sits
        alone = builder.build_prefix([demo]).input_ids[len(header.input_ids) :]
        assert prompt.input_ids[start:end] == alone
        text = tokenizer.decode(prompt.input_ids[start:end])
        assert demo.input.strip() in text
        assert builder.answer_text(demo).strip() in text
    assert query.input.strip() in tokenizer.decode(prompt.input_ids[slice(*prompt.query_span)])
    # piecewise ids == tokenising the whole text (answer included)
    builder.validate(demos, query)


def test_plain_layout_matches_documented_format(tokenizers):
    task = sentiment_task()
    demos, query = _demos_query(SENTIMENT_EXAMPLES)
    expected = "Classify the sentiment of each review.\n\n"
    for d in demos:
        expected += f"Review: {d.input}\nSentiment: {task.verbalizers[d.target]}\n\n"
    expected += f"Review: {query.input}\nSentiment:"
    for name, tokenizer in tokenizers.items():
        prompt = PromptBuilder(tokenizer, task).build(demos, query)
        bos = "<s>" if name == "gpt2-style" else ""  # only the gpt2-style tokenizer adds BOS
        assert prompt.text == bos + expected
        assert prompt.input_ids[0] == tokenizer.bos_token_id or not bos


def test_separator_position_follows_the_tokenizer(tokenizers):
    task = sentiment_task()
    assert PromptBuilder(tokenizers["gpt2-style"], task).separator_position == "leading"
    assert PromptBuilder(tokenizers["llama3-style"], task).separator_position == "trailing"
    # the wrong choice breaks natural tokenisation: ".\n\n" is one token for Llama-3 style
    wrong = PromptBuilder(tokenizers["llama3-style"], task, separator_position="leading")
    with pytest.raises(ValueError, match="differs from tokenising the whole prompt"):
        wrong.validate(*_demos_query(SENTIMENT_EXAMPLES))
    with pytest.raises(ValueError, match="separator_position='middle'"):
        PromptBuilder(tokenizers["gpt2-style"], task, separator_position="middle")


def test_bos_handling(tokenizers):
    task = sentiment_task()
    gpt2, llama3 = tokenizers["gpt2-style"], tokenizers["llama3-style"]
    bos = gpt2.bos_token_id
    assert PromptBuilder(gpt2, task).build([]).input_ids[0] == bos  # the tokenizer adds one
    assert PromptBuilder(gpt2, task, add_bos=False).build([]).input_ids[0] != bos
    assert PromptBuilder(llama3, task).build([]).input_ids[0] != bos  # this one does not
    assert PromptBuilder(llama3, task, add_bos=True).build([]).input_ids[0] == bos
    ids = PromptBuilder(gpt2, task).build(*_demos_query(SENTIMENT_EXAMPLES)).input_ids
    assert ids.count(bos) == 1
    chat_ids = PromptBuilder(gpt2, task, chat=True).build(*_demos_query(SENTIMENT_EXAMPLES))
    assert chat_ids.input_ids.count(bos) == 1  # from the template text, not doubled


def test_leading_space_rule(tokenizers):
    tokenizer = tokenizers["gpt2-style"]
    builder = PromptBuilder(tokenizer, sentiment_task())
    assert builder.answer_text("positive") == " great"
    assert [tokenizer.decode(ids) for ids in builder.label_ids()] == [" great", " terrible"]
    assert [len(ids) for ids in builder.label_ids()] == [1, 1]
    chat = PromptBuilder(tokenizer, sentiment_task(), chat=True)
    assert chat.answer_text("positive") == "great"
    multi = PromptBuilder(tokenizer, multi_token_task())
    assert all(len(ids) > 1 for ids in multi.label_ids())


def test_empty_instruction_trailing_layout_starts_with_the_first_demo(tokenizers):
    task = sentiment_task(instruction="")
    builder = PromptBuilder(tokenizers["llama3-style"], task)
    prompt = builder.build(*_demos_query(SENTIMENT_EXAMPLES))
    assert prompt.text.startswith("Review: the movie was great\n")
    assert prompt.demo_spans[0][0] == 0


@pytest.mark.parametrize("instruction", ["Classify the sentiment of each review.", ""])
def test_chat_prompt_equals_the_template_rendering(tokenizers, instruction):
    tokenizer = tokenizers["gpt2-style"]
    task = sentiment_task(instruction=instruction)
    builder = PromptBuilder(tokenizer, task, chat=True)
    for n_demos in (0, 1, 3):
        demos, query = list(SENTIMENT_EXAMPLES[:n_demos]), SENTIMENT_EXAMPLES[-1]
        messages = [{"role": "system", "content": instruction}] if instruction else []
        for d in demos:
            messages.append({"role": "user", "content": f"Review: {d.input}"})
            messages.append({"role": "assistant", "content": task.verbalizers[d.target]})
        messages.append({"role": "user", "content": f"Review: {query.input}"})
        rendered = tokenizer.apply_chat_template(messages, tokenize=False,
                                                 add_generation_prompt=True)  # fmt: skip
        prompt = builder.build(demos, query)
        assert prompt.text == rendered
        assert prompt.input_ids == tokenizer(rendered, add_special_tokens=False).input_ids
    # the template's default system prompt sits in the header, never in a demonstration
    has_default = "You are a tiny model." in builder.build_prefix([]).text
    assert has_default == (not instruction)


def test_non_compositional_chat_template_is_refused():
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = (
        "{% for m in messages %}{{ loop.index }}:{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}A:{% endif %}"
    )
    with pytest.raises(ValueError, match="renders .* differently"):
        PromptBuilder(tokenizer, sentiment_task(), chat=True)
    tokenizer.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        PromptBuilder(tokenizer, sentiment_task(), chat=True)


def test_max_length(tokenizers, llama):
    tokenizer = tokenizers["gpt2-style"]
    demos, query = _demos_query(SENTIMENT_EXAMPLES)
    full = PromptBuilder(tokenizer, sentiment_task()).build(demos, query)
    builder = PromptBuilder(tokenizer, sentiment_task(), max_length=len(full) - 1)
    with pytest.raises(ValueError, match=rf"{len(full)} tokens long but max_length is {len(full) - 1}"):
        builder.build(demos, query)
    builder.build_prefix(demos)  # the prefix alone still fits
    assert PromptBuilder.for_model(llama, tokenizer, sentiment_task()).max_length == 512


def test_bad_task_and_target(tokenizers):
    tokenizer = tokenizers["gpt2-style"]
    with pytest.raises(ValueError, match="kind='ranking'"):
        PromptBuilder(tokenizer, sentiment_task(kind="ranking"))
    with pytest.raises(ValueError, match=r"labels \['negative'\] have no verbalizer"):
        PromptBuilder(tokenizer, sentiment_task(verbalizers={"positive": "great"}))
    builder = PromptBuilder(tokenizer, sentiment_task())
    with pytest.raises(ValueError, match="target 'neutral' is not a label"):
        builder.answer_text(FakeExample("x", "meh", "neutral"))
    with pytest.raises(ValueError, match="has target 'neutral'; accepted labels: positive, negative"):
        builder.label_index(FakeExample("x", "meh", "neutral"))
    with pytest.raises(ValueError, match="needs a classification task"):
        PromptBuilder(tokenizer, qa_task()).label_ids()


# ---------------------------------------------------------------- scoring


def _prompts(builder, examples, n_demos=3):
    demos = list(examples[:n_demos])
    return [builder.build(demos, q) for q in examples[n_demos:]] + [builder.build([], examples[0])]


@pytest.mark.parametrize("model_name", ["llama", "qwen2"])
@pytest.mark.parametrize("task_name", ["single", "multi"])
def test_score_labels_fast_equals_reference_and_manual(request, tokenizers, model_name, task_name):
    model = request.getfixturevalue(model_name)
    make_task, examples = TASKS[task_name]
    builder = PromptBuilder(tokenizers["gpt2-style"], make_task())
    prompts = _prompts(builder, examples)
    fast = score_labels(model, builder, prompts)
    ref = score_labels(model, builder, prompts, reference=True)
    assert fast.shape == (len(prompts), len(builder.task.labels))
    torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-5)
    label_ids = builder.label_ids()
    for i, prompt in enumerate(prompts):
        for j, cont in enumerate(label_ids):
            manual = manual_continuation_logprob(model, prompt.input_ids, cont)
            assert fast[i, j].item() == pytest.approx(manual, abs=1e-4)


def test_batched_equals_one_at_a_time_and_padding_side_does_not_matter(tokenizers, qwen2):
    builder = PromptBuilder(tokenizers["gpt2-style"], multi_token_task())
    prompts = _prompts(builder, MULTI_EXAMPLES, n_demos=2)  # lengths differ
    assert len({len(p) for p in prompts}) > 1
    left = score_labels(qwen2, builder, prompts, padding_side="left")
    right = score_labels(qwen2, builder, prompts, padding_side="right")
    one_by_one = torch.cat([score_labels(qwen2, builder, [p], batch_size=1) for p in prompts])
    torch.testing.assert_close(left, right, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(left, one_by_one, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="padding_side='middle'"):
        score_labels(qwen2, builder, prompts, padding_side="middle")


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_padding_with_each_attention_implementation(tokenizers, attn):
    model = tiny_model("llama", attn_implementation=attn)
    builder = PromptBuilder(tokenizers["llama3-style"], sentiment_task())
    prompts = _prompts(builder, SENTIMENT_EXAMPLES, n_demos=2)
    left = score_labels(model, builder, prompts, padding_side="left")
    right = score_labels(model, builder, prompts, padding_side="right")
    ref = score_labels(model, builder, prompts, reference=True)
    assert torch.isfinite(left).all()
    torch.testing.assert_close(left, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(right, ref, rtol=1e-5, atol=1e-5)


def test_continuations_sharing_a_prefix_share_a_row(tokenizers, llama):
    # " great" is the first token of " great fun": both are read off one row
    task = sentiment_task(verbalizers={"positive": "great fun", "negative": "great"})
    builder = PromptBuilder(tokenizers["gpt2-style"], task)
    assert builder.label_ids()[1] == builder.label_ids()[0][:1]
    prompts = _prompts(builder, SENTIMENT_EXAMPLES)
    fast = score_labels(llama, builder, prompts)
    torch.testing.assert_close(fast, score_labels(llama, builder, prompts, reference=True),
                               rtol=1e-5, atol=1e-5)  # fmt: skip


def _prefix_cache(model, ids):
    with torch.no_grad():
        return output_cache(model(torch.tensor([ids]), use_cache=True))


@pytest.mark.parametrize("reference", [False, True], ids=["fast", "reference"])
def test_prefix_cache_plus_suffix_equals_full_prompt(tokenizers, qwen2, reference):
    builder = PromptBuilder(tokenizers["gpt2-style"], multi_token_task())
    demos = list(MULTI_EXAMPLES[:2])
    queries = list(MULTI_EXAMPLES[2:]) + [MULTI_EXAMPLES[0]]
    prefix = builder.build_prefix(demos)
    cache = _prefix_cache(qwen2, prefix.input_ids)
    suffixes = [builder.build_suffix(q) for q in queries]
    cached = score_labels(qwen2, builder, suffixes, prefix=cache, reference=reference)
    assert cache.get_seq_length() == len(prefix)  # the caller's cache is not modified
    full = score_labels(qwen2, builder, [builder.build(demos, q) for q in queries])
    torch.testing.assert_close(cached, full, rtol=1e-5, atol=1e-5)
    explicit = score_labels(qwen2, builder, suffixes, prefix=cache,
                            position_offset=len(prefix), reference=reference)  # fmt: skip
    torch.testing.assert_close(explicit, cached, rtol=0, atol=0)
    shifted = score_labels(qwen2, builder, suffixes, prefix=cache,
                           position_offset=len(prefix) + 7, reference=reference)  # fmt: skip
    # position ids really are used (a random tiny model is only faintly position-sensitive)
    assert (shifted - cached).abs().max() > 1e-5


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("reference", [False, True], ids=["fast", "reference"])
def test_per_prompt_prefix_rows_with_different_demo_subsets(tokenizers, llama, side, reference):
    """One prefix row per query, each a different demonstration subset (padded slots masked)."""
    builder = PromptBuilder(tokenizers["gpt2-style"], multi_token_task())
    subsets = [list(MULTI_EXAMPLES[:2]), [MULTI_EXAMPLES[2]], []]
    queries = [MULTI_EXAMPLES[3], MULTI_EXAMPLES[0], MULTI_EXAMPLES[1]]
    prefix = exact_prefix(llama, [builder.build_prefix(d).input_ids for d in subsets], side)
    suffixes = [builder.build_suffix(q) for q in queries]
    full = [builder.build(d, q) for d, q in zip(subsets, queries, strict=True)]
    cached = score_labels(llama, builder, suffixes, prefix=prefix, reference=reference)
    torch.testing.assert_close(cached, score_labels(llama, builder, full), rtol=1e-5, atol=1e-5)
    losses = answer_loss(llama, builder, suffixes, queries, prefix=prefix, reference=reference)
    torch.testing.assert_close(losses, answer_loss(llama, builder, full, queries),
                               rtol=1e-5, atol=1e-5)  # fmt: skip
    # one shared row serves every prompt
    shared = prefix.select([0])
    cached = score_labels(llama, builder, suffixes, prefix=shared, reference=reference)
    expected = score_labels(llama, builder, [builder.build(subsets[0], q) for q in queries])
    torch.testing.assert_close(cached, expected, rtol=1e-5, atol=1e-5)


def test_prefix_errors(tokenizers, llama):
    builder = PromptBuilder(tokenizers["gpt2-style"], sentiment_task())
    prefix = exact_prefix(llama, [[1, 2, 3], [1, 2]])
    suffixes = [builder.build_suffix(q) for q in SENTIMENT_EXAMPLES[:3]]
    with pytest.raises(ValueError, match="prefix has 2 rows for 3 prompts"):
        score_labels(llama, builder, suffixes, prefix=prefix)
    with pytest.raises(ValueError, match="position_offset applies to a plain transformers Cache"):
        score_labels(llama, builder, suffixes[:2], prefix=prefix, position_offset=3)
    with pytest.raises(ValueError, match=r"prefix_rows must be 1 row indices in \[0, 2\)"):
        continuation_logprobs(llama, [[1]], [[2]], prefix=prefix, prefix_rows=[5])


def test_with_the_cache_module_prefix(tokenizers, qwen2):
    """Integration with icl_ssm.compress.cache.PrefixCache (exact teacher cache), when present."""
    cache_module = importlib.import_module("icl_ssm.compress.cache")
    builder = PromptBuilder(tokenizers["gpt2-style"], multi_token_task())
    subsets = [list(MULTI_EXAMPLES[:2]), [MULTI_EXAMPLES[2]]]
    queries = [MULTI_EXAMPLES[3], MULTI_EXAMPLES[0]]
    prefix_ids = [builder.build_prefix(d).input_ids for d in subsets]
    width = max(map(len, prefix_ids))
    ids = torch.tensor([p + [0] * (width - len(p)) for p in prefix_ids])
    mask = torch.tensor([[1] * len(p) + [0] * (width - len(p)) for p in prefix_ids])
    prefix = cache_module.dense_cache(qwen2, ids, mask)
    suffixes = [builder.build_suffix(q) for q in queries]
    full = [builder.build(d, q) for d, q in zip(subsets, queries, strict=True)]
    torch.testing.assert_close(score_labels(qwen2, builder, suffixes, prefix=prefix),
                               score_labels(qwen2, builder, full), rtol=1e-5, atol=1e-5)  # fmt: skip
    assert greedy_generate(qwen2, suffixes, max_new_tokens=4, prefix=prefix) == greedy_generate(
        qwen2, full, max_new_tokens=4
    )


def test_losses(tokenizers, llama):
    builder = PromptBuilder(tokenizers["gpt2-style"], multi_token_task())
    demos, queries = list(MULTI_EXAMPLES[:2]), list(MULTI_EXAMPLES[2:])
    prompts = [builder.build(demos, q) for q in queries]
    scores = score_labels(llama, builder, prompts)
    gold = torch.tensor([builder.label_index(q) for q in queries])
    nll = answer_loss(llama, builder, prompts, queries)
    torch.testing.assert_close(nll, -scores[torch.arange(len(queries)), gold], rtol=1e-5, atol=1e-5)
    ce = answer_loss(llama, builder, prompts, queries, normalize=True)
    expected = -(scores.log_softmax(-1)[torch.arange(len(queries)), gold])
    torch.testing.assert_close(ce, expected, rtol=1e-5, atol=1e-5)
    assert (ce < nll).all()  # normalising over the label set can only lower the loss
    ref = answer_loss(llama, builder, prompts, queries, reference=True, batch_size=1)
    torch.testing.assert_close(ref, nll, rtol=1e-5, atol=1e-5)
    preds = predict_labels(llama, builder, prompts)
    assert preds == [builder.task.labels[i] for i in scores.argmax(-1).tolist()]
    with pytest.raises(ValueError, match="2 prompts but 1 examples"):
        answer_loss(llama, builder, prompts, queries[:1])


def test_generative_loss_is_nll_of_gold_answer_tokens(tokenizers, llama):
    builder = PromptBuilder(tokenizers["gpt2-style"], qa_task())
    demos, queries = list(QA_EXAMPLES[:1]), list(QA_EXAMPLES[1:])
    prompts = [builder.build(demos, q) for q in queries]
    loss = answer_loss(llama, builder, prompts, queries)
    for prompt, q, value in zip(prompts, queries, loss.tolist(), strict=True):
        gold = builder.answer_ids(q)
        assert tokenizers["gpt2-style"].decode(gold) == " " + q.target
        assert value == pytest.approx(-manual_continuation_logprob(llama, prompt.input_ids, gold),
                                      abs=1e-4)  # fmt: skip
    with pytest.raises(ValueError, match="needs a classification task"):
        answer_loss(llama, builder, prompts, queries, normalize=True)


def test_scoring_input_errors(tokenizers, llama):
    with pytest.raises(ValueError, match="context 0 is empty"):
        continuation_logprobs(llama, [[]], [[5]])
    with pytest.raises(ValueError, match="continuation 0 is empty"):
        continuation_logprobs_ref(llama, [[1]], [[]])
    with pytest.raises(ValueError, match="2 contexts but 1 continuations"):
        continuation_logprobs(llama, [[1], [2]], [[3]])
    with pytest.raises(ValueError, match=r"shape \(1, 3\)"):
        continuation_logprobs(llama, [torch.ones(1, 3, dtype=torch.long)], [[3]])
    with pytest.raises(ValueError, match="needs 600 positions but the model's context"):
        continuation_logprobs(llama, [[1] * 590], [[3] * 11])
    cache = _prefix_cache(llama, [1, 2, 3])
    cache.batch_repeat_interleave(2)
    with pytest.raises(ValueError, match="plain transformers Cache as prefix must have batch size 1, got 2"):
        continuation_logprobs(llama, [[1]], [[3]], prefix=cache)


def test_prompt_tensor_and_ids_inputs(tokenizers, llama):
    builder = PromptBuilder(tokenizers["gpt2-style"], sentiment_task())
    prompt = builder.build(*_demos_query(SENTIMENT_EXAMPLES))
    assert isinstance(prompt, Prompt)
    as_prompt = score_labels(llama, builder, [prompt])
    torch.testing.assert_close(score_labels(llama, builder, [prompt.tensor()]), as_prompt)
    torch.testing.assert_close(score_labels(llama, builder, [prompt.input_ids]), as_prompt)


# ---------------------------------------------------------------- generation


def test_greedy_generate_matches_hf_generate(llama):
    prompt = [1, 50, 60, 70, 80]
    ours = greedy_generate(llama, [prompt], max_new_tokens=8)[0]
    with torch.no_grad():
        hf = llama.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False,
                            eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()  # fmt: skip
    assert ours == hf


def test_greedy_generate_batched_cached_and_stopping(tokenizers, qwen2):
    builder = PromptBuilder(tokenizers["gpt2-style"], qa_task())
    demos = list(QA_EXAMPLES[:1])
    prompts = [builder.build(demos, q) for q in QA_EXAMPLES]
    one_by_one = [greedy_generate(qwen2, [p], max_new_tokens=6)[0] for p in prompts]
    assert greedy_generate(qwen2, prompts, max_new_tokens=6) == one_by_one
    cache = _prefix_cache(qwen2, builder.build_prefix(demos).input_ids)
    suffixes = [builder.build_suffix(q) for q in QA_EXAMPLES]
    assert greedy_generate(qwen2, suffixes, max_new_tokens=6, prefix=cache) == one_by_one
    per_row = exact_prefix(qwen2, [builder.build_prefix(d).input_ids for d in ([], demos, demos)])
    expected = [greedy_generate(qwen2, [builder.build(d, q)], max_new_tokens=6)[0]
                for d, q in zip(([], demos, demos), QA_EXAMPLES, strict=True)]  # fmt: skip
    assert greedy_generate(qwen2, suffixes, max_new_tokens=6, prefix=per_row) == expected
    # an EOS id ends a row (and is dropped); a stop callable ends it after the token
    first = one_by_one[0]
    assert greedy_generate(qwen2, prompts[:1], max_new_tokens=6, eos_token_ids=[first[2]]) == [
        first[: first.index(first[2])]
    ]
    stopped = greedy_generate(qwen2, prompts[:1], max_new_tokens=6, stop=lambda ids: len(ids) == 3)
    assert stopped == [first[:3]]
    assert greedy_generate(qwen2, prompts[:1], max_new_tokens=0) == [[]]


def test_generate_answers_cuts_at_stop_string_and_extracts(tokenizers, qwen2):
    tokenizer = tokenizers["gpt2-style"]
    builder = PromptBuilder(tokenizer, qa_task())
    prompts = [builder.build(list(QA_EXAMPLES[:1]), q) for q in QA_EXAMPLES]
    raw = generate_answers(qwen2, builder, prompts, max_new_tokens=6, stop_strings=(),
                           extract=False)  # fmt: skip
    ids = greedy_generate(qwen2, prompts, max_new_tokens=6, eos_token_ids=[tokenizer.eos_token_id])
    assert raw == [tokenizer.decode(x, skip_special_tokens=True) for x in ids]
    # a stop string inside the first answer: the answer is what precedes it
    stop = raw[0][len(raw[0]) // 2] if raw[0] else "x"
    cut = generate_answers(qwen2, builder, prompts[:1], max_new_tokens=6, stop_strings=(stop,),
                           extract=False)  # fmt: skip
    assert cut == [raw[0].split(stop, 1)[0]]
    extracted = generate_answers(qwen2, builder, prompts, max_new_tokens=6, stop_strings=())
    assert extracted == [builder.task.extract_answer(r) for r in raw]


def test_answer_lead_is_what_every_answer_starts_with(tokenizers):
    tok = tokenizers["gpt2-style"]
    sentiment = PromptBuilder(tok, sentiment_task())
    assert sentiment.answer_lead() == []  # " positive" / " negative": told apart at once
    numbers = PromptBuilder(tok, get_task("modular_addition", p=13, size=40))
    lead = numbers.answer_lead()
    labels = numbers.label_ids()
    assert lead and all(ids[: len(lead)] == lead for ids in labels)  # the space every " 12" starts with
    assert len({ids[len(lead)] for ids in labels}) > 1  # the next token tells answers apart
    qa = PromptBuilder(tok, qa_task())
    with pytest.raises(ValueError, match="generative: answer_lead needs examples"):
        qa.answer_lead()
    same_start = [FakeExample("a", "q", "Paris is big"), FakeExample("b", "q", "Paris")]
    cut = qa.answer_lead(same_start)
    assert cut == qa.answer_ids(same_start[1])[:-1]  # one token short of the shortest answer

"""Shared test utilities: tiny random models, tiny in-process tokenizers, fake tasks.

Nothing here downloads anything. Import as ``from helpers import ...`` (pytest puts the
``tests`` directory on ``sys.path``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerFast

from icl_ssm.lm.hf import output_cache
from icl_ssm.lm.tiny import TINY_CHAT_TEMPLATE, TINY_CORPUS, TINY_SPECIAL_TOKENS, tiny_model, tiny_tokenizer

# the pre-tokenizer regex of Llama-3 / Qwen2: punctuation absorbs the newlines after it
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def tiny_llama3_style_tokenizer(*, vocab_size: int = 400) -> PreTrainedTokenizerFast:
    """Like :func:`icl_ssm.lm.tiny.tiny_tokenizer` but with Llama-3's pre-tokenizer regex and
    no BOS added (as Qwen2): ``".\\n\\n"`` is one pre-token here."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(TINY_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(list(TINY_CORPUS) * 4 + ["ok.\n\nno.\n\n"] * 8, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        additional_special_tokens=["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"],
        chat_template=TINY_CHAT_TEMPLATE,
    )


def tiny_llama(**overrides) -> PreTrainedModel:
    """Random 2-layer Llama, GQA (4 query heads, 2 KV heads), vocabulary of the tiny tokenizer."""
    return tiny_model("llama", **overrides)


def tiny_qwen2(**overrides) -> PreTrainedModel:
    """Random 2-layer Qwen2, GQA, explicit ``head_dim=16`` (!= hidden_size // heads = 8)."""
    return tiny_model("qwen2", **overrides)


def save_tiny(path: Path, arch: str = "llama", *, seed: int = 0, **overrides) -> Path:
    """Write a tiny model + the tiny tokenizer with ``save_pretrained``; returns ``path``."""
    tiny_model(arch, seed=seed, **overrides).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


@dataclass(frozen=True)
class FakeExample:
    """Same fields as ``icl_ssm.data.tasks.Example``."""

    id: str
    input: str
    target: str


@dataclass(frozen=True)
class FakeTask:
    """Duck-typed stand-in for ``icl_ssm.data.tasks.Task``."""

    name: str = "fake-sentiment"
    kind: str = "classification"
    labels: tuple[str, ...] = ("positive", "negative")
    verbalizers: dict[str, str] = field(
        default_factory=lambda: {"positive": "great", "negative": "terrible"}
    )
    instruction: str = "Classify the sentiment of each review."
    input_prefix: str = "Review: "
    output_prefix: str = "Sentiment: "  # trailing space on purpose: the builder strips it

    def extract_answer(self, text: str) -> str:
        return text.strip().split("\n")[0].strip()

    def score(self, prediction: str, example: FakeExample) -> float:
        return float(prediction == example.target)

    def __hash__(self) -> int:
        return hash(self.name)


def sentiment_task(**overrides) -> FakeTask:
    """Single-token verbalisers ``" great"`` / ``" terrible"`` with the tiny tokenizer."""
    return FakeTask(**overrides)


def multi_token_task(**overrides) -> FakeTask:
    """Three labels whose verbalisers are several tokens each, sharing a first token."""
    kwargs = dict(
        name="fake-multi",
        labels=("pos", "neg", "neu"),
        verbalizers={"pos": "very positive", "neg": "very negative", "neu": "neutral-ish"},
    )
    kwargs.update(overrides)
    return FakeTask(**kwargs)


def qa_task(**overrides) -> FakeTask:
    kwargs = dict(
        name="fake-qa",
        kind="generative",
        labels=(),
        verbalizers={},
        instruction="Answer the question.",
        input_prefix="Question: ",
        output_prefix="Answer:",
    )
    kwargs.update(overrides)
    return FakeTask(**kwargs)


SENTIMENT_EXAMPLES = (
    FakeExample("d0", "the movie was great", "positive"),
    FakeExample("d1", "a terrible , boring film.", "negative"),
    FakeExample("d2", "I loved every minute of it!", "positive"),
    FakeExample("d3", "the acting was terrible too", "negative"),
    FakeExample("q0", "great fun", "positive"),
    FakeExample("q1", "the plot was terrible (really)", "negative"),
)

MULTI_EXAMPLES = (
    FakeExample("m0", "the movie was great", "pos"),
    FakeExample("m1", "a boring film", "neg"),
    FakeExample("m2", "it was fine", "neu"),
    FakeExample("m3", "I hated it", "neg"),
)

QA_EXAMPLES = (
    FakeExample("a0", "what is two plus two", "four"),
    FakeExample("a1", "what is the capital of France?", "Paris."),
    FakeExample("a2", "what is 3 + 4", "7"),
)


@dataclass(frozen=True)
class FakePrefix:
    """The interface of ``icl_ssm.compress.cache.PrefixCache`` that icl_ssm.lm.prompts relies on:
    per-layer ``(B, H_kv, L, d)`` keys/values, ``mask: (B, L)``, ``next_position: (B,)``."""

    keys: tuple
    values: tuple
    mask: torch.Tensor
    next_position: torch.Tensor

    @property
    def batch_size(self) -> int:
        return self.mask.shape[0]

    def select(self, index) -> FakePrefix:
        index = torch.as_tensor(index, dtype=torch.long)
        return FakePrefix(
            tuple(k[index] for k in self.keys),
            tuple(v[index] for v in self.values),
            self.mask[index],
            self.next_position[index],
        )

    def to_dynamic(self) -> DynamicCache:
        return DynamicCache(ddp_cache_data=list(zip(self.keys, self.values, strict=True)))


def exact_prefix(model, prompts: list[list[int]], side: str = "right") -> FakePrefix:
    """The model's own K/V of each prompt, padded on ``side`` (pad slots masked out)."""
    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.bool)
    for b, p in enumerate(prompts):
        lo = width - len(p) if side == "left" else 0
        ids[b, lo : lo + len(p)] = torch.tensor(p)
        mask[b, lo : lo + len(p)] = True
    positions = (mask.long().cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        cache = output_cache(model(ids, attention_mask=mask.long(), position_ids=positions, use_cache=True))
    keys = tuple(layer.keys for layer in cache.layers)
    values = tuple(layer.values for layer in cache.layers)
    return FakePrefix(keys, values, mask, mask.sum(1))


def manual_continuation_logprob(model, context: list[int], continuation: list[int]) -> float:
    """Token by token, one forward per token, no cache: the most literal computation."""
    total = 0.0
    ids = list(context)
    for tok in continuation:
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1].double()
        total += float(logits.log_softmax(-1)[tok])
        ids.append(tok)
    return total


def research_script(name: str, folder: str = "research"):
    """The module ``<folder>/<name>.py`` (a script, not a package), loaded by path."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / folder / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script

"""Tasks read from the Hugging Face dataset hub (``pip install 'icl-ssm[hub]'``) or a local copy:
``sst2``, ``poem_sentiment``, ``gsm8k``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

from icl_ssm.data.files import label_from, read_records, record_field
from icl_ssm.data.tasks import Example, HubUnavailableError, Task, register, validate_flag

HUB_EXTRA = "pip install 'icl-ssm[hub]'"


def load_hub(path: str, config: str | None = None, split: str | None = None) -> Any:
    """``datasets.load_dataset(path, config, split=split)``, importing `datasets` lazily."""
    try:
        import datasets  # optional dependency: the [hub] extra
    except ModuleNotFoundError as err:
        raise HubUnavailableError(
            f"loading {path!r} from the hub needs the `datasets` package: {HUB_EXTRA} "
            "(or pass path= to a local copy of the data)"
        ) from err
    try:
        return datasets.load_dataset(path, config, split=split)
    except Exception as err:  # network, auth, renamed data set: all unactionable here
        raise HubUnavailableError(
            f"could not load {path!r} ({config}, split {split}) from the hub: {err}; "
            "pass path= to a local copy of the data"
        ) from err


@dataclass
class HubTask(Task):
    """A hub data set; ``path=`` (alias ``data_files=``) reads a local .jsonl/.csv/.tsv instead."""

    path: str | None = None
    data_files: str | None = None

    hub: ClassVar[tuple[str, str | None]] = ("", None)  # (data set, config)
    hub_splits: ClassVar[tuple[str, ...]] = ("train",)
    fields: ClassVar[tuple[str, str]] = ("text", "label")  # (input field, target field)

    def __post_init__(self) -> None:
        if self.path is not None and self.data_files is not None and self.path != self.data_files:
            raise ValueError(f"task {self.name!r}: pass path= or data_files=, not both")
        self.path = self.path if self.path is not None else self.data_files
        hub = "/".join(p for p in self.hub if p)
        self.source = f"local file {self.path}" if self.path else f"hub: {hub} (needs {HUB_EXTRA})"

    def offline(self) -> bool:
        return self.path is not None

    def convert(self, record: dict[str, Any], where: str) -> tuple[str, str] | None:
        """(input, target) for one record, or None to drop it."""
        text = record_field(record, self.fields[0], where, "input field")
        target = record_field(record, self.fields[1], where, "target field")
        if self.kind == "classification":
            if target == "-1":  # GLUE's unlabeled test split
                return None
            target = label_from(target, self.labels, where)
        return text, target

    def load(self) -> list[Example]:
        out = []
        if self.path is not None:
            for number, record in read_records(self.path):
                pair = self.convert(record, f"{self.path} line {number}")
                if pair is not None:
                    out.append(Example(f"line-{number}", *pair))
            return out
        for split_name in self.hub_splits:
            rows = load_hub(self.hub[0], self.hub[1], split=split_name)
            for i, record in enumerate(rows):
                pair = self.convert(dict(record), f"{self.hub[0]} {split_name} row {i}")
                if pair is not None:
                    out.append(Example(f"{split_name}-{i}", *pair))
        return out


SENTIMENT_LABELS = ("negative", "positive")


@register("sst2")
@dataclass
class SST2(HubTask):
    """GLUE SST-2 (train + validation; the test split is unlabeled)."""

    labels = SENTIMENT_LABELS
    verbalizers = {"negative": "negative", "positive": "positive"}
    instruction = "Classify the sentiment of the movie review as positive or negative."
    input_prefix = "Review: "
    output_prefix = "Sentiment: "
    hub = ("glue", "sst2")
    hub_splits = ("train", "validation")
    fields = ("sentence", "label")


@register("poem_sentiment")
@dataclass
class PoemSentiment(HubTask):
    """Sentiment of lines of poetry (labels in the data set's own index order)."""

    labels = ("negative", "positive", "no_impact", "mixed")
    verbalizers = {
        "negative": "negative",
        "positive": "positive",
        "no_impact": "neutral",
        "mixed": "mixed",
    }
    instruction = "Classify the sentiment of the line of poetry."
    input_prefix = "Verse: "
    output_prefix = "Sentiment: "
    hub = ("google-research-datasets/poem_sentiment", None)
    hub_splits = ("train", "validation", "test")
    fields = ("verse_text", "label")


_NUMBER = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?")


def _canonical_number(text: str) -> str:
    """'1,234.50' -> '1234.5', '$7' -> '7', '18.0' -> '18'."""
    cleaned = text.replace(",", "").replace("$", "")
    try:
        value = float(cleaned)
    except ValueError:
        return ""
    return str(int(value)) if value.is_integer() else repr(value)


@register("gsm8k")
@dataclass
class GSM8K(HubTask):
    """Grade-school math word problems; generative, scored by exact numeric match.

    ``target`` is the data set's answer text (worked solution ending ``#### <number>``) so
    demonstrations show the reasoning; with ``rationale=False`` it is the number alone.
    """

    rationale: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        self.rationale = validate_flag(self.rationale, "gsm8k: rationale")

    kind = "generative"
    instruction = "Solve the math word problem. End with '#### ' followed by the final number."
    input_prefix = "Question: "
    output_prefix = "Answer: "
    hub = ("openai/gsm8k", "main")
    hub_splits = ("train", "test")
    fields = ("question", "answer")

    def convert(self, record: dict[str, Any], where: str) -> tuple[str, str] | None:
        question = record_field(record, "question", where, "input field")
        answer = record_field(record, "answer", where, "target field")
        if not self.extract_answer(answer):
            raise ValueError(f"{where}: answer {answer[-40:]!r} has no number after '####'")
        return question, answer if self.rationale else self.extract_answer(answer)

    def extract_answer(self, text: str) -> str:
        """The number after ``####`` if present, else the last number; commas removed."""
        if "####" in text:
            found = _NUMBER.search(text.split("####", 1)[1])
            return _canonical_number(found.group()) if found else ""
        numbers = _NUMBER.findall(text)
        return _canonical_number(numbers[-1]) if numbers else ""

    def score(self, prediction: str, example: Example) -> float:
        answer = self.extract_answer(prediction)
        return float(answer != "" and answer == self.extract_answer(example.target))

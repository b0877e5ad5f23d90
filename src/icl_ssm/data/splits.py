"""Pool / validation / test splits: deduplicated, label-stratified where there are labels,
reproducible from a seed."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from icl_ssm.data.tasks import Example, Task, normalize_text, positive_int

DEFAULT_POOL_SIZE = 1500  # candidate pool size used in the paper
MAX_TEST, TEST_SHARE = 500, 4  # default test split: min(500, n // 4)
MAX_VALIDATION, VALIDATION_SHARE = 100, 10  # default validation split: min(100, n // 10)
MINORITY_SHARE = 0.05  # label_warning: a label under this share of the pool is flagged


@dataclass(frozen=True)
class Splits:
    """Disjoint (by id and by normalised text) candidate pool, validation and test sets.

    ``note``: one line saying how the sizes were fitted to a small data set
    (``split(..., fit=True)``), else None.
    """

    pool: list[Example] = field(default_factory=list)
    validation: list[Example] = field(default_factory=list)
    test: list[Example] = field(default_factory=list)
    note: str | None = None


class SplitSizes(NamedTuple):
    pool: int
    validation: int
    test: int


def pool_minimum(k: int) -> int:
    """Smallest pool :func:`fit_split_sizes` keeps for ``k`` demonstrations: ``k`` plus a
    margin of ``max(2, k // 2)``, so a selection still chooses among candidates."""
    return k + max(2, k // 2)


def fit_split_sizes(
    n_examples: int,
    *,
    pool_size: int = DEFAULT_POOL_SIZE,
    validation_size: int | None = None,
    test_size: int | None = None,
    k: int = 0,
    min_validation: int = 0,
    name: str = "the task",
) -> tuple[SplitSizes, str | None]:
    """Split sizes for ``n_examples`` distinct examples, shrunk in proportion when too few.

    Asked: ``validation_size`` (default ``min(100, n // 10)``), raised to ``min_validation``
    (e.g. the validation queries a selection scores on); ``test_size`` (default
    ``min(500, n // 4)``); a defaulted split is at least 1; and a pool of ``pool_size``,
    which takes what the other two leave (as :func:`split` does). When the pool's default
    share, the validation and the test splits add up to more than ``n``, all three shrink
    in proportion; then the pool is kept at :func:`pool_minimum` ``(k)`` or more, and the
    validation and test splits at 1 or more (unless 0 was asked).

    Returns ``(sizes, note)``: ``note`` is one line saying what was asked, what the data
    holds and what is used, or None when the sizes are the ones asked. Raises ValueError,
    naming ``name``, when ``pool_size < k`` or the minimums do not fit in ``n``.
    """
    n = positive_int(n_examples, f"{name}: number of examples", 0)
    pool_size = positive_int(pool_size, "pool_size", 0)
    k = positive_int(k, "k", 0)
    if pool_size < k:
        raise ValueError(f"pool_size={pool_size} is smaller than k={k}; ask for a pool of at least "
                         f"{pool_minimum(k)} (k + {pool_minimum(k) - k}) to choose k from")
    default_val = max(1, min(MAX_VALIDATION, n // VALIDATION_SHARE))
    default_test = max(1, min(MAX_TEST, n // TEST_SHARE))
    val_asked = default_val if validation_size is None else positive_int(validation_size, "val_size", 0)
    want = SplitSizes(
        pool=min(pool_size, max(0, n - default_val - default_test)),  # the pool's default share
        validation=max(val_asked, positive_int(min_validation, "min_validation", 0)),
        test=default_test if test_size is None else positive_int(test_size, "test_size", 0),
    )
    pool_floor = min(pool_minimum(k), pool_size)
    shrunk = sum(want) > n or want.pool < pool_floor
    pool, val, test = _shrink(n, want, pool_floor, k=k, name=name) if shrunk else want
    sizes = SplitSizes(pool=min(pool_size, n - val - test), validation=val, test=test)
    raised = want.validation > val_asked
    if not shrunk and not raised and sizes.pool == pool_size:
        return sizes, None
    asked = want._replace(pool=pool_size)
    queries = f" to serve {min_validation} queries" if raised else ""
    if shrunk:
        kept = (f", keeping a pool of {pool_floor} (k={k} + {pool_floor - k}) to choose from"
                if pool == pool_floor else "")
        return sizes, _fit_note(name, n, sizes, asked, queries=queries, shrunk=f"shrunk in proportion{kept}")
    why = []
    if raised:
        why.append(f"validation raised from {'the default ' if validation_size is None else ''}{val_asked}{queries}")
    if sizes.pool < pool_size:
        why.append(f"pool {sizes.pool} of the {pool_size} asked")
    return sizes, _fit_note(name, n, sizes, asked, why=", ".join(why))


def _shrink(n: int, want: SplitSizes, pool_floor: int, *, k: int, name: str) -> SplitSizes:
    """``want`` shrunk in proportion to fit ``n`` examples: the pool kept at ``pool_floor`` or
    more (before :func:`fit_split_sizes` caps it at the pool asked), the validation and test
    splits at 1 or more unless 0 was wanted. Raises ValueError, naming ``name``, when these
    minimums do not fit in ``n``."""
    floors = (min(1, want.validation), min(1, want.test))
    if n - pool_floor < sum(floors):
        raise ValueError(
            f"{name}: {n} distinct examples, too few to split for k={k}: at least {pool_floor + sum(floors)} "
            f"are needed (a pool of {pool_floor} = k + {pool_floor - k} to choose from, "
            f"{floors[0]} validation and {floors[1]} test example); add examples or lower k"
        )
    pool = max(pool_floor, _quotas(n, list(want))[0])
    rest = n - pool
    val, test = _quotas(rest, [want.validation, want.test])
    if val < floors[0]:
        val, test = floors[0], rest - floors[0]
    if test < floors[1]:
        val, test = rest - floors[1], floors[1]
    return SplitSizes(pool=pool, validation=val, test=test)


def _fit_note(name: str, n: int, sizes: SplitSizes, asked: SplitSizes, *, queries: str = "",
              shrunk: str | None = None, why: str = "") -> str:
    """The line :func:`fit_split_sizes` returns beside ``sizes``: with ``shrunk`` (how), what was
    ``asked`` (the pool asked, the validation and test splits wanted, ``queries`` saying why the
    validation was raised); else ``why`` the sizes used are not the ones asked."""
    used = f"pool {sizes.pool}, validation {sizes.validation}, test {sizes.test}"
    if shrunk is not None:
        return (f"{name}: {n} distinct examples, too few for the splits asked (pool {asked.pool}, validation "
                f"{asked.validation}{queries}, test {asked.test}); using {used}: {shrunk}")
    return f"{name}: {n} distinct examples; using {used}: {why}"


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
    *,
    fit: bool = False,
    k: int = 0,
    min_val_size: int = 0,
) -> Splits:
    """Carve a candidate pool, a validation set and a test set; deterministic for ``seed``.

    Examples are deduplicated first (:func:`dedupe`). Defaults: ``test_size = min(500, n//4)``,
    ``val_size = min(100, n//10)`` for n distinct examples; the pool takes ``pool_size`` of
    what remains (the paper's 1500), or all of it if fewer. Splits are stratified by
    ``group`` (default: the task's :meth:`Task.group`, i.e. the subject for MMLU), each
    group contributing in proportion to its size. Each split is in a random order.

    ``fit=True``: sizes from :func:`fit_split_sizes` (validation at least ``min_val_size``,
    a pool of at least :func:`pool_minimum` ``(k)``, shrunk to fit a small data set), and
    :attr:`Splits.note` says what changed. Where the asked sizes fit, the splits are the
    same as without ``fit``.
    """
    examples, group, name = _examples_to_split(task_or_examples, group)
    rows = len(examples)
    examples = dedupe(examples)
    n = len(examples)
    if n == 0:
        raise ValueError(f"split: {name} has no examples to split")
    note = None
    if fit:
        sizes, note = fit_split_sizes(n, pool_size=pool_size, validation_size=val_size, test_size=test_size, k=k,
                                      min_validation=min_val_size, name=name)
        pool_size, val_size, test_size = sizes
        if note is not None and rows > n:
            note += f" ({rows - n} of the {rows} examples repeat an earlier text and are dropped)"
    test_size = min(MAX_TEST, n // TEST_SHARE) if test_size is None else positive_int(test_size, "test_size", 0)
    val_size = (min(MAX_VALIDATION, n // VALIDATION_SHARE) if val_size is None
                else positive_int(val_size, "val_size", 0))
    pool_size = positive_int(pool_size, "pool_size", 0)
    if test_size + val_size > n:
        raise ValueError(f"split: test_size={test_size} + val_size={val_size} exceeds the {n} distinct examples")
    chosen = _draw(examples, group, {"test": test_size, "validation": val_size, "pool": pool_size}, seed)
    return Splits(
        pool=[examples[i] for i in chosen["pool"]],
        validation=[examples[i] for i in chosen["validation"]],
        test=[examples[i] for i in chosen["test"]],
        note=note,
    )


def _examples_to_split(
    task_or_examples: Task | Sequence[Example], group: Callable[[Example], str] | None
) -> tuple[list[Example], Callable[[Example], str], str]:
    """``(examples, group, name)``: a task's examples, its :meth:`Task.group` unless ``group``
    is given, and its name for errors; plain examples form one group unless ``group`` is given."""
    if isinstance(task_or_examples, Task):
        examples = task_or_examples.examples()
        group = group or task_or_examples.group
        name = task_or_examples.name or "the task"
    else:
        examples = list(task_or_examples)
        name = "the examples"
    return examples, group or (lambda ex: ""), name


def _draw(
    examples: Sequence[Example], group: Callable[[Example], str], sizes: dict[str, int], seed: int
) -> dict[str, list[int]]:
    """Indices into ``examples`` for each split of ``sizes``, drawn in its order, each group
    contributing in proportion to what it has left; each split in the order of one seeded shuffle."""
    n = len(examples)
    rng = np.random.default_rng(seed)
    rank = np.empty(n, dtype=np.int64)
    rank[rng.permutation(n)] = np.arange(n)  # rank[i]: position of example i in a shuffle
    members: dict[str, list[int]] = {}
    for i, ex in enumerate(examples):
        members.setdefault(group(ex), []).append(i)
    queues = [sorted(members[g], key=lambda i: rank[i]) for g in sorted(members)]
    chosen: dict[str, list[int]] = {}
    for part, size in sizes.items():
        picked: list[int] = []
        for q, take in zip(queues, _quotas(size, [len(q) for q in queues]), strict=True):
            picked += q[:take]
            del q[:take]
        chosen[part] = sorted(picked, key=lambda i: rank[i])
    return chosen


def label_warning(
    examples: Sequence[Example], labels: Sequence[str] | None = None, *, minority: float = MINORITY_SHARE
) -> str | None:
    """A one-line warning when the examples' labels leave little to select, else None.

    Warns when every example has the same label (every prompt then shows that one answer),
    or when a label has fewer than ``minority`` of the examples (or none, for a label in
    ``labels``, the task's label names). Call it on the candidate pool of a classification
    task; ``labels=()`` (a generative task, whose answers are not labels) never warns.
    """
    if labels is not None and not labels:
        return None
    counts = Counter(ex.target for ex in examples)
    for label in labels or ():
        counts.setdefault(label, 0)
    n = sum(counts.values())
    if n == 0:
        return None
    shown = ", ".join(f"{label!r} {count}" for label, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    present = [label for label, count in counts.items() if count]
    if len(present) == 1:
        every = f"all {n} examples have" if n > 1 else "the one example has"
        return (f"{every} the label {present[0]!r} (label counts: {shown}): every prompt shows only "
                "that answer, so there is nothing to select between labels; check the label field, or add examples "
                "of the other labels")
    rare = sorted(label for label, count in counts.items() if count < minority * n)
    if rare:
        return (f"label {', '.join(map(repr, rare))} {'has' if len(rare) == 1 else 'have'} fewer than "
                f"{minority:.0%} of the {n} examples (label counts: {shown}): few prompts will show "
                f"{'it' if len(rare) == 1 else 'them'}; consider balancing the data or selecting per label")
    return None


def validate_k(pool: Sequence[Example], k: int) -> None:
    """Raise ValueError if ``k`` demonstrations cannot be drawn from ``pool``."""
    if not isinstance(k, int) or k < 0:
        raise ValueError(f"k={k!r}: expected a non-negative integer")
    if k > len(pool):
        raise ValueError(
            f"k={k} demonstrations requested but the candidate pool has only {len(pool)} "
            "examples; lower k or enlarge the pool (pool_size=, or a larger task size=)"
        )


def split_notes(splits: Splits, task: Task) -> list[str]:
    """What a task's splits say of themselves before a selection: the splits' own note (sizes
    fitted to a small file), the task's notes and, for a classification task, a pool whose labels
    leave little to select (:func:`label_warning`)."""
    labels = task.labels if task.kind == "classification" else ()
    return [note for note in (splits.note, *task.notes(), label_warning(splits.pool, labels)) if note]

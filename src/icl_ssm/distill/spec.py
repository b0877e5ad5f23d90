"""What a distillation's stored teacher targets depend on: :class:`TeacherSpec` (the teacher, the
tasks, the episodes and the shapes the targets are kept at), the store's :data:`FORMAT`, and the
teacher's :func:`model_fingerprint`. A store written under another spec is refused by name."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields

FORMAT = 1


_LATER_FIELDS = ("shared_tail", "shared_tail_every", "answer_leads")  # TeacherSpec fields added after FORMAT 1


def validate_shared_tail(shared_tail: int, every: int, k: int) -> None:
    """The shared-tail settings of :func:`sample_episodes`, or a ValueError naming them."""
    if not isinstance(shared_tail, int) or not 0 <= shared_tail < k:
        raise ValueError(f"shared_tail must be an integer in [0, k={k}), got {shared_tail!r}")
    if not isinstance(every, int) or every < 1:
        raise ValueError(f"shared_tail_every must be a positive integer, got {every!r}")


@dataclass(frozen=True)
class TeacherSpec:
    """Everything the stored targets depend on."""

    model: str
    model_fingerprint: str
    tasks: tuple[str, ...]
    k: int
    episodes: int
    queries: int = 8
    group_size: int = 4
    num_virtual: int = 16
    num_sink: int = 4
    num_recent: int = 0
    topk: int = 64
    seed: int = 0
    chat: bool = False
    shard_size: int = 16
    format: int = FORMAT
    shared_tail: int = 0  # last demonstrations common to the subsets of a group (see sample_episodes)
    shared_tail_every: int = 1  # ... in every such group (1: all groups; 2: every other group)
    # per task, the tokens every answer starts with (PromptBuilder.answer_lead), appended to each
    # query so that the targets are read where answers differ; () when no task has one
    answer_leads: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "answer_leads", tuple(tuple(int(t) for t in lead) for lead in self.answer_leads))
        if self.answer_leads and len(self.answer_leads) != len(self.tasks):
            raise ValueError(f"answer_leads has {len(self.answer_leads)} entries for {len(self.tasks)} tasks; "
                             "expected one per task (or none)")
        for name in ("k", "episodes", "queries", "group_size", "num_virtual", "topk", "shard_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not self.tasks:
            raise ValueError("at least one task is needed")
        validate_shared_tail(self.shared_tail, self.shared_tail_every, self.k)

    def key(self) -> str:
        blob = asdict(self)
        for f in fields(self):  # fields added later are left out at their default: older caches keep their key
            if f.name in _LATER_FIELDS and blob[f.name] == f.default:
                del blob[f.name]
        return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:16]

    @property
    def num_shards(self) -> int:
        return -(-self.episodes // self.shard_size)


def model_fingerprint(model) -> str:
    """Hash of the teacher's config and parameter count: a changed teacher changes targets."""
    config = model.config.to_dict()
    for volatile in ("_name_or_path", "transformers_version", "torch_dtype", "dtype"):
        config.pop(volatile, None)
    blob = json.dumps(config, sort_keys=True, default=str) + str(sum(p.numel() for p in model.parameters()))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]

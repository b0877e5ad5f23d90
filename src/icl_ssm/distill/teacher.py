"""The frozen teacher's targets for distillation, computed once and stored on disk.

A training *episode* is one demonstration subset (k examples from a task's candidate pool)
and Q queries from the same pool (never the validation or test split). Episodes come in
*groups* of subsets that share their queries, so that the student can be taught how losses
*differ between subsets* on the same queries, the quantity selection ranks by.

Here: the episodes the targets are computed for (what they depend on, :class:`TeacherSpec`, is
:mod:`icl_ssm.distill.spec`; the episodes they are computed for
(:func:`sample_episodes`) and their store on disk (:func:`build_teacher_cache` fills it,
:class:`TeacherCache` reads it). One episode's targets (the pooled K/V of the prompt, each
query's answer distribution, gold and label log-probabilities and hidden states) are
:func:`icl_ssm.distill.targets.teacher_targets`.

Shards are safetensors files written atomically under a directory keyed by everything the
targets depend on (``meta.json``); a directory written with other settings is refused with
the differences named. Shard j is computed by process ``j mod world``, so several processes
(``accelerate launch``) fill one cache together.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save
from torch import Tensor

from icl_ssm import atomic
from icl_ssm.data.splits import split
from icl_ssm.data.tasks import Example, get_task
from icl_ssm.distill.spec import TeacherSpec
from icl_ssm.distill.targets import teacher_targets
from icl_ssm.lm.prompts import PromptBuilder


@dataclass(frozen=True)
class Episode:
    task: int  # index into spec.tasks
    group: int
    demos: tuple[int, ...]  # pool indices, in prompt order
    queries: tuple[int, ...]  # pool indices


def sample_episodes(pool_sizes: Sequence[int], spec: TeacherSpec) -> list[Episode]:
    """Deterministic episodes: tasks take turns group by group; within a group, ``group_size``
    subsets of ``k`` demonstrations share ``queries`` queries drawn from the rest of the pool.

    With ``spec.shared_tail = w > 0`` the subsets of a group also end with the same ``w``
    demonstrations and differ only before them: what tells their losses apart lies outside an
    exact window over the last tokens, so a ranking loss over the group can only be met by
    the compressed summary of the earlier demonstrations. With ``spec.shared_tail_every = e``
    only every e-th group does so (the others still teach how the last demonstrations read).
    """
    rng = np.random.default_rng(spec.seed)
    episodes: list[Episode] = []
    group = 0
    while len(episodes) < spec.episodes:
        task = group % len(pool_sizes)
        n = pool_sizes[task]
        if n < spec.k + spec.queries:
            raise ValueError(
                f"task {spec.tasks[task]!r}: the pool has {n} examples, fewer than k + queries = "
                f"{spec.k} + {spec.queries}"
            )
        queries = rng.choice(n, spec.queries, replace=False)
        rest = np.setdiff1d(np.arange(n), queries)
        w = spec.shared_tail if group % spec.shared_tail_every == spec.shared_tail_every - 1 else 0
        tail = rng.choice(rest, w, replace=False) if w else rest[:0]
        rest = np.setdiff1d(rest, tail)
        for _ in range(min(spec.group_size, spec.episodes - len(episodes))):
            demos = np.concatenate([rng.choice(rest, spec.k - len(tail), replace=False), tail])
            episodes.append(Episode(task, group, tuple(int(i) for i in demos), tuple(int(i) for i in queries)))
        group += 1
    return episodes


def answer_leads(builders: Sequence[PromptBuilder], pools: Sequence[Sequence[Example]]) -> tuple:
    """``TeacherSpec.answer_leads`` for these tasks: each builder's ``answer_lead`` over its
    pool's answers, or ``()`` when no task has one (the targets then sit at the answer position)."""
    leads = tuple(tuple(b.answer_lead(pool)) for b, pool in zip(builders, pools, strict=True))
    return leads if any(leads) else ()


def task_builders(model, tokenizer, tasks: Sequence[str], *, seed: int, chat: bool,
                  task_options: dict | None = None) -> tuple[list[PromptBuilder], list[list[Example]]]:
    """The prompt builder and candidate pool of every task, as the teacher pass uses them."""
    loaded = [get_task(name, **(task_options or {}).get(name, {})) for name in tasks]
    pools = [split(task, seed=seed).pool for task in loaded]
    return [PromptBuilder.for_model(model, tokenizer, task, chat=chat) for task in loaded], pools


def _ragged(seqs: Sequence[Sequence[int]]) -> tuple[Tensor, Tensor]:
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.long)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    flat = torch.tensor([t for s in seqs for t in s], dtype=torch.int32)
    return flat, offsets


def _unragged(flat: Tensor, offsets: Tensor) -> list[Tensor]:
    return [flat[offsets[i] : offsets[i + 1]].long() for i in range(len(offsets) - 1)]


def _atomic_save(tensors: dict[str, Tensor], path: Path) -> None:
    data = save({k: v.contiguous() for k, v in tensors.items()})
    atomic.write_with(path, lambda f: f.write(data))


def _meta_diffs(stored: dict, spec: TeacherSpec, ignore: tuple[str, ...] = ()) -> list[str]:
    """Where a cache's stored meta differs from ``spec`` (fields added later keep their default)."""
    mine = asdict(spec)
    defaults = {f.name: f.default for f in fields(TeacherSpec)}
    return [f"{k}: cache has {stored.get(k, defaults[k])!r}, requested {mine[k]!r}" for k in mine
            if k not in ignore and json.dumps(stored.get(k, defaults[k])) != json.dumps(mine[k])]


def _check_meta(directory: Path, spec: TeacherSpec) -> None:
    meta_path = directory / "meta.json"
    if not meta_path.exists():
        return
    diffs = _meta_diffs(json.loads(meta_path.read_text()), spec)
    if diffs:
        raise ValueError(f"teacher cache {str(directory)!r} was written with other settings; refusing to "
                         "reuse it: " + "; ".join(diffs))


@dataclass
class TeacherCache:
    """Read access to a complete teacher cache directory."""

    directory: Path
    spec: TeacherSpec
    episodes: list[Episode] = field(repr=False)
    _shards: dict = field(default_factory=dict, repr=False)

    @classmethod
    def open(cls, directory: str | Path, spec: TeacherSpec | None = None) -> TeacherCache:
        directory = Path(directory)
        meta_path = directory / "meta.json"
        if not meta_path.exists():
            raise ValueError(f"{str(directory)!r} is not a teacher cache (no meta.json)")
        meta = json.loads(meta_path.read_text())
        stored = TeacherSpec(**{**meta, "tasks": tuple(meta["tasks"])})
        if spec is not None:
            _check_meta(directory, spec)
        missing = [j for j in range(stored.num_shards) if not (directory / f"shard-{j:05d}.safetensors").exists()]
        if missing:
            raise ValueError(f"teacher cache {str(directory)!r} is incomplete: shards {missing[:8]} are missing")
        episodes = [Episode(**{**e, "demos": tuple(e["demos"]), "queries": tuple(e["queries"])})
                    for e in json.loads((directory / "episodes.json").read_text())]
        return cls(directory, stored, episodes)

    def __len__(self) -> int:
        return len(self.episodes)

    def shard(self, j: int) -> dict[str, Tensor]:
        if j not in self._shards:
            self._shards = {j: load_file(str(self.directory / f"shard-{j:05d}.safetensors"))}  # keep one
        return self._shards[j]

    def get(self, i: int) -> dict[str, Tensor]:
        """Episode ``i``'s targets (the keys of :func:`teacher_targets`)."""
        j, r = divmod(i, self.spec.shard_size)
        s = self.shard(j)
        out = {name: s[name][r] for name in ("pool_k", "pool_v", "top_idx", "top_logp", "gold_token",
                                               "gold_logp", "label_logp", "hidden")}
        out["prompt_ids"] = _unragged(s["prompt_ids"], s["prompt_offsets"])[r]
        Q = self.spec.queries
        queries = _unragged(s["query_ids"], s["query_offsets"])
        out["query_ids"] = queries[r * Q : (r + 1) * Q]
        out["label_tokens"] = s["label_tokens"][r]
        out["group"] = self.episodes[i].group
        return out


def teacher_cache_dir(spec: TeacherSpec, root: str | Path | None = None) -> Path:
    from icl_ssm.data.assets import cache_dir

    return Path(root) if root is not None else cache_dir() / "teacher" / spec.key()


def _reusable_shards(directory: Path, spec: TeacherSpec, episodes: list[Episode]) -> dict[int, Path]:
    """Shards of sibling caches that hold exactly the episodes of one of our shards.

    Episodes are drawn in sequence from one generator, so a cache that differs from ``spec``
    only in its episode count holds the first shards of ``spec``'s cache: growing ``--samples``
    computes only the new episodes. Each reused shard is checked episode by episode.
    """
    found: dict[int, Path] = {}
    if not directory.parent.is_dir():
        return found
    for other in sorted(directory.parent.iterdir()):
        meta_path, eps_path = other / "meta.json", other / "episodes.json"
        if other == directory or not (meta_path.is_file() and eps_path.is_file()):
            continue
        try:
            meta, theirs = json.loads(meta_path.read_text()), json.loads(eps_path.read_text())
        except (OSError, ValueError):
            continue
        if _meta_diffs(meta, spec, ignore=("episodes",)):
            continue
        size = spec.shard_size
        for j in range(spec.num_shards):
            block = json.loads(json.dumps([asdict(e) for e in episodes[j * size : (j + 1) * size]]))
            shard = other / f"shard-{j:05d}.safetensors"
            if j not in found and shard.is_file() and block == theirs[j * size : (j + 1) * size]:
                found[j] = shard
    return found


def _shard_tensors(rows: list[dict]) -> dict[str, Tensor]:
    """One shard's tensors from its episodes' :func:`teacher_targets`: every target stacked on a
    leading episode axis, the token ids ragged (flat + offsets), the label axis padded to the
    shard's largest label count (tokens with -1, log-probabilities with -inf)."""
    n_labels = max(r["label_tokens"].numel() for r in rows)
    prompt_ids, prompt_offsets = _ragged([r["prompt_ids"].tolist() for r in rows])
    query_ids, query_offsets = _ragged([q.tolist() for r in rows for q in r["query_ids"]])
    def padded(name: str, value: float) -> Tensor:  # tasks differ in their label count
        return torch.stack([F.pad(r[name], (0, n_labels - r[name].shape[-1]), value=value) for r in rows])

    tensors = {
        "prompt_ids": prompt_ids, "prompt_offsets": prompt_offsets,
        "query_ids": query_ids, "query_offsets": query_offsets,
        "label_tokens": padded("label_tokens", -1), "label_logp": padded("label_logp", float("-inf")),
    }
    for name in ("pool_k", "pool_v", "top_idx", "top_logp", "gold_token", "gold_logp", "hidden"):
        tensors[name] = torch.stack([r[name] for r in rows])
    return tensors


def _copy_atomic(src: Path, path: Path) -> None:
    with open(src, "rb") as source:
        atomic.write_with(path, lambda f: shutil.copyfileobj(source, f))


def build_teacher_cache(
    model,
    tokenizer,
    spec: TeacherSpec,
    directory: str | Path | None = None,
    rank: int = 0,
    world: int = 1,
    progress: Callable[[int, int], None] | None = None,
    task_options: dict | None = None,
) -> Path:
    """Fill (or finish) the cache for ``spec``: this process computes shards ``rank::world``.

    Returns the directory. Shards already present are kept: an interrupted build resumes.
    """
    directory = teacher_cache_dir(spec, directory)
    directory.mkdir(parents=True, exist_ok=True)
    _check_meta(directory, spec)
    builders, pools = task_builders(model, tokenizer, spec.tasks, seed=spec.seed, chat=spec.chat,
                                    task_options=task_options)
    leads = answer_leads(builders, pools)
    if leads != spec.answer_leads:
        raise ValueError(f"spec.answer_leads is {spec.answer_leads!r}, but the answers of {list(spec.tasks)} start "
                         f"with {leads!r}: build the spec with teacher.answer_leads(*teacher.task_builders(...))")
    episodes = sample_episodes([len(p) for p in pools], spec)
    if rank == 0:
        # a temporary name of its own: several runs may open one cache at the same moment
        for name, payload in (("episodes.json", [asdict(e) for e in episodes]), ("meta.json", asdict(spec))):
            atomic.write_text(directory / name, json.dumps(payload))
    mine = [j for j in range(spec.num_shards) if j % world == rank]
    reusable = _reusable_shards(directory, spec, episodes)
    total = sum(len(episodes[j * spec.shard_size : (j + 1) * spec.shard_size]) for j in mine)
    done = 0
    for j in mine:
        path = directory / f"shard-{j:05d}.safetensors"
        block = episodes[j * spec.shard_size : (j + 1) * spec.shard_size]
        if not path.exists() and j in reusable:
            _copy_atomic(reusable[j], path)
        if path.exists():
            done += len(block)
            if progress:
                progress(done, total)
            continue
        rows = []
        for e in block:
            pool = pools[e.task]
            rows.append(teacher_targets(model, builders[e.task], [pool[i] for i in e.demos],
                                        [pool[i] for i in e.queries], spec, leads[e.task] if leads else ()))
            done += 1
            if progress:
                progress(done, total)
        _atomic_save(_shard_tensors(rows), path)
    return directory

"""The dense path's answers kept on disk: a fidelity run on the same queries reads every subset
row an earlier run computed (:class:`DenseStore`), keyed by :func:`weights_digest` and every
other input the answers depend on."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from transformers import PreTrainedModel

from icl_ssm import atomic
from icl_ssm.cost import CPU_ATTENTION, Cost
from icl_ssm.data.tasks import Example
from icl_ssm.evaluate.answers import PrefixEval
from icl_ssm.lm.batch import PromptLike, as_ids
from icl_ssm.lm.prompts import PromptBuilder


def weights_digest(model: torch.nn.Module) -> str:
    """Hash of a model's parameter names, shapes, dtypes and 64 values strided through each.

    Cheap (no full pass over the weights) and changed by any fine-tune, unlike a hash of
    the config alone."""
    h = hashlib.sha256()
    for name, param in model.named_parameters():
        flat = param.detach().reshape(-1)
        sample = flat[:: max(1, flat.numel() // 64)][:64].double().cpu().numpy()
        h.update(f"{name}{tuple(param.shape)}{param.dtype}".encode())
        h.update(sample.tobytes())
    return h.hexdigest()[:16]


class DenseStore:
    """The dense path's answers, one safetensors file per subset row, reused by later runs.

    A row's file is named by a hash of its prompt tokens and of everything else its answers
    depend on: the model's config and :func:`weights_digest`, its dtype and device type, every
    query's tokens and gold answer, the answer lead, the labels and the loss, and the way FLOPs
    are counted (the stored cost must match a fresh one's). A run on the same
    queries reads every row it finds and computes only the rest (the prefill over ``k``
    demonstrations is most of a fidelity run's time); a killed run keeps the rows it finished.
    Nothing is ever reused for different inputs: those have another name. Each file is
    written atomically. A row costs ``4 x vocabulary x queries`` bytes (its logits).
    """

    def __init__(self, root: str | Path, model: PreTrainedModel, builder: PromptBuilder,
                 queries: Sequence[Example], loss: str):
        task = builder.task
        blob = {
            "config": model.config.to_dict(), "weights": weights_digest(model), "dtype": str(model.dtype),
            "device": model.device.type, "loss": loss, "kind": task.kind,
            "queries": [[builder.build_suffix(q).input_ids, str(q.target)] for q in queries],
            "lead": builder.answer_lead(queries),
            "labels": builder.label_ids() if task.kind == "classification" else None,
            # the FLOP formulas added to torch's (a stored row's cost must match a fresh count)
            "flops": sorted(op.__name__ for op in CPU_ATTENTION),
        }
        for volatile in ("_name_or_path", "transformers_version"):
            blob["config"].pop(volatile, None)
        key = hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode()).hexdigest()[:16]
        self.directory = atomic.prepare_dir(Path(root) / key, "dense store")
        self.reused = 0  # rows read back so far

    def _path(self, ids: Sequence[int]) -> Path:
        return self.directory / f"{hashlib.sha256(np.asarray(ids, dtype=np.int64).tobytes()).hexdigest()[:24]}.st"

    def get(self, prompts: Sequence[PromptLike]) -> PrefixEval | None:
        """The stored answers after every prompt, rows in order, or None if any row is missing."""
        paths = [self._path(as_ids(p)) for p in prompts]
        if not all(path.exists() for path in paths):
            return None
        from safetensors.torch import load_file

        rows = []
        for path in paths:
            t = load_file(path)
            cost = Cost(int(t["flops"]), float(t["seconds"]))
            rows.append(PrefixEval(t["loss"], t["correct"], t["pred"], t["prompt_length"],
                                   int(t["cache_length"]), t["logits"], cost, t.get("scores")))
        self.reused += len(rows)
        return PrefixEval.cat(rows)

    def put(self, prompts: Sequence[PromptLike], ev: PrefixEval) -> None:
        """Store ``ev`` (with logits), one file per row; each row is charged an equal share of the cost."""
        if ev.logits is None or ev.rows != len(prompts):
            raise ValueError(f"DenseStore.put needs one evaluated row with logits per prompt ({len(prompts)})")
        from safetensors.torch import save

        for r, prompt in enumerate(prompts):
            t = {"loss": ev.loss[r : r + 1], "correct": ev.correct[r : r + 1], "pred": ev.pred[r : r + 1],
                 "prompt_length": ev.prompt_length[r : r + 1], "logits": ev.logits[r : r + 1],
                 "cache_length": torch.tensor(ev.cache_length),
                 **({} if ev.scores is None else {"scores": ev.scores[r : r + 1]}),
                 "flops": torch.tensor(ev.cost.flops // ev.rows), "seconds": torch.tensor(ev.cost.seconds / ev.rows,
                                                                                         dtype=torch.float64)}
            data = save({name: v.contiguous().cpu() for name, v in t.items()})
            atomic.write_with(self._path(as_ids(prompt)), lambda f, data=data: f.write(data))

"""Do the demonstrations have to see each other for the subset ranking?

    python research/blocks.py REPORT.json [--tails 1 2 4 8] [--out ROWS.json]

REPORT.json: an ``icl-ssm fidelity --json`` report (its held-out subsets, queries and dense
subset losses are reused). Three kinds of cache, each at the prompt's own positions (the
queries start where the full prompt ends):

* ``block``: every demonstration encoded on its own after the header (it sees the header and
  itself, not the other demonstrations), its K/V laid at its place in the prompt. Nothing in it
  depends on the subset but the positions, so each candidate's block could be encoded once and
  shared by every subset that holds it: Algorithm 2 would then pay n short prefills instead of
  M dense ones.
* ``block tail s``: the header and the last ``s`` tokens of every block (its label and the
  separator after it).
* ``dense tail s``: the same slots cut from the dense prompt's cache (they have seen the whole
  prompt before them): what dropping tokens costs when cross-demonstration attention is kept.

Prints each cache's subset-loss Spearman with the full dense loss and its fidelity metrics
against the full dense prompt; ``--out`` writes every row as JSON.
"""

import argparse
import json

import numpy as np
import torch
from rich.console import Console
from rich.progress import Progress
from transformers import DynamicCache

from icl_ssm import atomic
from icl_ssm.compress.cache import PrefixCache, dense_cache
from icl_ssm.evaluate.fidelity_report import fidelity_report, report_setting
from icl_ssm.evaluate.paths import evaluate_paths
from icl_ssm.evaluate.stats import spearman_ci
from icl_ssm.lm.batch import pad_ids
from icl_ssm.lm.hf import kv_from_cache, output_cache, with_cache
from icl_ssm.lm.models import load_model, resolve_device
from icl_ssm.lm.prompts import Prompt


def block_kv(model, prompt: Prompt):
    """Per layer ``(H_kv, L, d)`` keys and values of ``prompt``'s prefix with every
    demonstration encoded after the header alone, at its own positions in the prompt."""
    h = prompt.demo_spans[0][0] if prompt.demo_spans else len(prompt.input_ids)
    header = prompt.input_ids[:h]
    rows = [header + prompt.input_ids[a:e] for a, e in prompt.demo_spans]
    ids, mask = pad_ids(rows, "right", 0)
    pos = torch.zeros_like(ids)
    for r, (a, e) in enumerate(prompt.demo_spans):
        pos[r, : h + e - a] = torch.tensor([*range(h), *range(a, e)])
    dev = model.device
    with torch.no_grad():
        out = model(input_ids=ids.to(dev), attention_mask=mask.long().to(dev), position_ids=pos.to(dev),
                    use_cache=True, **with_cache(model, DynamicCache()))
    keys, values = kv_from_cache(output_cache(out))

    def lay(t):  # (R, H, S, d) -> (H, L, d): the header from row 0, then each block's own tokens
        parts = [t[0, :, :h]] + [t[r, :, h : h + e - a] for r, (a, e) in enumerate(prompt.demo_spans)]
        return torch.cat(parts, dim=1)

    return [lay(k) for k in keys], [lay(v) for v in values]


def tail_slots(prompt: Prompt, s: int) -> list[int]:
    """The header's slots and the last ``s`` of every demonstration's."""
    h = prompt.demo_spans[0][0]
    return [*range(h), *(i for a, e in prompt.demo_spans for i in range(max(a, e - s), e))]


def stack(model, kvs: list, slots: list[list[int]], lengths: list[int]) -> PrefixCache:
    """Right-padded :class:`PrefixCache` of per-prompt ``(keys, values)`` cut to ``slots``;
    queries go on at each prompt's full length."""
    B, S = len(kvs), max(len(s) for s in slots)
    dev = model.device
    mask = torch.zeros(B, S, dtype=torch.bool, device=dev)
    layers = len(kvs[0][0])
    keys, values = [], []
    for layer in range(layers):
        k0 = kvs[0][0][layer]
        kb = k0.new_zeros(B, k0.shape[0], S, k0.shape[-1])
        vb = kb.clone()
        for b, ((ks, vs), sl) in enumerate(zip(kvs, slots, strict=True)):
            idx = torch.tensor(sl, device=dev)
            kb[b, :, : len(sl)] = ks[layer].index_select(1, idx)
            vb[b, :, : len(sl)] = vs[layer].index_select(1, idx)
            mask[b, : len(sl)] = True
        keys.append(kb)
        values.append(vb)
    n = torch.tensor(lengths, device=dev)
    return PrefixCache(tuple(keys), tuple(values), mask, next_position=n, prompt_length=n)


def dense_tail_cache(model, prompts: list[Prompt], ids, mask, s: int) -> PrefixCache:
    """The dense cache of ``prompts`` (right-padded ``ids``/``mask``) cut to :func:`tail_slots`."""
    full = dense_cache(model, ids, mask)
    kvs = [([k[b] for k in full.keys], [v[b] for v in full.values]) for b in range(len(prompts))]
    return stack(model, kvs, [tail_slots(p, s) for p in prompts], [len(p.input_ids) for p in prompts])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("report")
    ap.add_argument("--tails", type=int, nargs="*", default=[1, 2, 4, 8])
    ap.add_argument("--subsets", type=int, help="only the first N subsets of the report")
    ap.add_argument("--out", help="write every row to this JSON file")
    args = ap.parse_args()
    r = json.load(open(args.report))
    cfg = r["config"]
    model, tok = load_model(cfg["model"], device=resolve_device())
    setting = report_setting(r, model, tok, args.subsets)
    builder, queries, ids, dense, prompts = (setting.builder, setting.queries, setting.subsets, setting.dense,
                                             setting.prompts)
    task = builder.task
    by_ids = {tuple(p.input_ids): p for p in prompts}

    def rows_of(i, m):
        return [by_ids[tuple(i[b, : int(m[b].sum())].tolist())] for b in range(i.shape[0])]

    def block(s: int | None):
        def build(i, m):
            ps = rows_of(i, m)
            kvs = [block_kv(model, p) for p in ps]
            slots = [list(range(len(p.input_ids))) if s is None else tail_slots(p, s) for p in ps]
            return stack(model, kvs, slots, [len(p.input_ids) for p in ps])
        return build

    def dense_tail(s: int):
        return lambda i, m: dense_tail_cache(model, rows_of(i, m), i, m, s)

    paths = {"dense": lambda i, m: dense_cache(model, i, m), "block": block(None)}
    for s in args.tails:
        paths[f"block tail {s}"] = block(s)
    for s in args.tails:
        paths[f"dense tail {s}"] = dense_tail(s)
    stderr = Console(stderr=True)
    bar = Progress(console=stderr, transient=True)
    job = bar.add_task("subsets", total=len(ids))

    def advance(n: int) -> None:
        bar.advance(job, n)
        if not stderr.is_terminal:
            done = bar.tasks[0]
            stderr.print(f"blocks: {int(done.completed)}/{int(done.total)} subsets, {done.elapsed:.0f} s")

    bar.start()
    out = evaluate_paths(model, builder, prompts, queries, paths, loss=cfg["loss"], batch=cfg["batch"],
                            query_batch=cfg["query_batch"], progress=advance)
    bar.stop()
    full = out["dense"][0].subset_loss().numpy()
    assert np.allclose(full, dense, atol=1e-3), "the report's dense losses are not reproduced"
    labels = [builder.label_index(q) for q in queries] if task.kind == "classification" else None
    L = float(np.mean([len(p.input_ids) for p in prompts]))
    h = prompts[0].demo_spans[0][0]
    print(f"{r['task']}, k = {r['k']}: {len(ids)} subsets x {len(queries)} queries; prompt {L:.0f} tokens "
          f"(header {h}) on average\n")
    print("| cache | slots | Spearman [95% CI] | KL | rel logit err | accuracy | GFLOP per subset |\n"
          "|---|---:|---:|---:|---:|---:|---:|")
    result = {}
    for name, (ev, agreement) in out.items():
        if name == "dense":
            continue
        f = fidelity_report(out["dense"][0], ev, agreement, labels=labels)
        s = int(name.rsplit(" ", 1)[1]) if "tail" in name else None
        slots = L if s is None else float(np.mean([len(tail_slots(p, s)) for p in prompts]))
        lo, hi = spearman_ci(ev.subset_loss().numpy(), dense)
        print(f"| {name} | {slots:.0f} | {f['subset_loss_spearman']:+.2f} [{lo:+.2f}, {hi:+.2f}] | {f['kl']:.3f} | "
              f"{f['rel_logit_err']:.3f} | {f['acc_compressed']:.3f} | {f['flops_compressed'] / 1e9:.1f} |")
        result[name] = {**f, "slots": slots, "subset_loss_spearman_ci95": [lo, hi],
                        "subset_loss": ev.subset_loss().tolist()}
    first = next(iter(result.values()))
    print(f"\ndense accuracy {first['acc_dense']:.3f}, {first['flops_dense'] / 1e9:.1f} GFLOP per subset")
    if args.out:
        atomic.write_json(args.out, {"report": args.report, "task": r["task"], "k": r["k"], "subsets": len(ids),
                                     "queries": len(queries), "prompt_tokens_mean": L, "header_tokens": h,
                                     "dense_subset_loss": dense.tolist(), "paths": result,
                                     "threads": torch.get_num_threads()})


if __name__ == "__main__":
    main()

"""Per-demonstration readouts: the SSM's state at each demonstration's end -> that
demonstration's last ``s`` K/V slots.

    python research/tail_readout.py TEACHER_CACHE REPORT.json [--tail 4] [--control] --out DIR

``research/blocks.py`` found that the header plus the last 3-4 tokens of every demonstration,
cut from the dense cache, rank held-out subsets nearly as well as a window three times their
size, while the same slots encoded without the other demonstrations rank them backwards. The
ranking sits in those slots *after* they have read the prompt before them. An SSM state at a
demonstration's end is a causal summary of exactly that prefix, so this compressor reads it
out there: for demonstration j, the time-invariant LegS state after its last token (one scan,
every state kept) and the embeddings of its last ``s`` tokens go through the factored head
to ``s`` (K, V) pairs per layer; keys come out before RoPE and are rotated to the slots'
positions in the prompt. The cache is the exact header plus ``k * s`` such slots; queries
start where the prompt ends.

Training reuses an ``icl-ssm distill`` teacher cache (its prompts, queries and answer
targets). Stage 1 aligns the slots with the dense cache's own K/V at those positions (keys
un-rotated), computed here once; stage 2 is the recipe's KL + hidden + rank loss.
``--control`` replaces the states by a learned constant: the head then sees only the tail
tokens and their positions. The held-out evaluation re-reads REPORT.json's subsets and
queries, with the dense tail of the same slots beside it.
"""

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from icl_ssm import atomic
from icl_ssm.compress.cache import PrefixCache, dense_cache, teacher_forward
from icl_ssm.compress.compressor import SSMCompressor, SSMCompressorConfig
from icl_ssm.data.splits import split
from icl_ssm.data.tasks import get_task
from icl_ssm.distill.config import DistillConfig
from icl_ssm.distill.losses import bucket_kl, hidden_loss, label_kl, rank_loss
from icl_ssm.distill.teacher import TeacherCache
from icl_ssm.evaluate.fidelity_report import fidelity_report, report_setting
from icl_ssm.evaluate.paths import evaluate_paths
from icl_ssm.evaluate.stats import spearman_ci
from icl_ssm.lm.batch import pad_ids
from icl_ssm.lm.hf import kv_from_cache, output_cache
from icl_ssm.lm.models import load_model
from icl_ssm.lm.prefix import forward_with_prefix
from icl_ssm.lm.prompts import Prompt, PromptBuilder
from icl_ssm.ssm import scan as S

sys.path.insert(0, str(Path(__file__).resolve().parent))
import blocks  # noqa: E402  (research/blocks.py: the label-line slots and the dense cache cut to them)

Tensor = torch.Tensor


def tail_positions(prompt: Prompt, s: int) -> list[int]:
    """The last ``s`` positions of every demonstration (:func:`blocks.tail_slots` without the header)."""
    return blocks.tail_slots(prompt, s)[prompt.demo_spans[0][0] :]


def rotate(model, k: Tensor, positions: Tensor) -> Tensor:
    """RoPE of ``positions: (B, S)`` applied to keys ``(B, H, S, d)`` (negative: un-rotate)."""
    cos, sin = model.model.rotary_emb(k, positions)
    return apply_rotary_pos_emb(k, k, cos, sin)[1]



class TailReadout(torch.nn.Module):
    def __init__(self, model, s: int, control: bool, k: int = 20, gate_init: float | None = None):
        super().__init__()
        cfg = SSMCompressorConfig.for_teacher(model.config, name="smollm2-135m", state_size=256, num_virtual=s,
                                              num_sink=0, dt=0.002, control=control)
        self.c = SSMCompressor(cfg)
        self.s = s
        H, R = model.config.hidden_size, cfg.latent_size
        self.tok = torch.nn.Parameter(torch.randn(cfg.num_groups, H, R) / math.sqrt(H))
        # a learned attention-logit bias per slot (demonstration j, tail slot i), as G's gates: a
        # strongly negative start hides the slots, and training opens each only as far as it helps
        self.gate = None if gate_init is None else torch.nn.Parameter(torch.full((k * s,), float(gate_init)))

    def forward(self, model, prompts: list[Prompt]) -> tuple[list[Tensor], list[Tensor], Tensor]:
        """Slots of every prompt: keys (post-RoPE) and values per layer ``(B, H, k*s, d)``, and
        their positions ``(B, k*s)``. Every prompt has the same number of demonstrations."""
        dev = model.device
        ids, mask = (t.to(dev) for t in pad_ids([p.input_ids for p in prompts]))
        emb = model.get_input_embeddings()(ids).detach()
        pos = torch.tensor([tail_positions(p, self.s) for p in prompts], device=dev)  # (B, k*s)
        ends = torch.tensor([[e - 1 for _, e in p.demo_spans] for p in prompts], device=dev)  # (B, k)
        B, k = ends.shape
        c = self.c
        if c.config.control:
            st = c.constant[None, None].expand(B, k, -1, -1)
        else:
            ssm = c.ssm
            Bbar = ssm.Bbar.reshape(ssm.groups * ssm.channels, ssm.channel_size, -1)
            states = S.scan_fast(emb, Bbar, ssm.power_cache(dev), mask, return_states=True, check_finite=False)
            states = states.reshape(B, ids.shape[1], ssm.groups, -1)  # (B, T, G, N)
            st = states[torch.arange(B, device=dev)[:, None], ends]  # (B, k, G, N)
        G, N = st.shape[-2:]
        cfg = c.config
        V, R = cfg.num_virtual, cfg.latent_size
        x = F.layer_norm(st.reshape(B * k, G, N), (N,)) * c.state_scale + c.state_shift
        z = torch.einsum("bgn,gnk->bgk", x, c.to_latent) + c.latent_bias
        z = F.gelu(z).view(B * k, G, V, R) + c.latent_pos
        tails = emb.gather(1, pos[..., None].expand(-1, -1, emb.shape[-1])).view(B * k, V, -1)  # (B*k, s, H)
        z = z + torch.einsum("bvh,ghr->bgvr", tails, self.tok)
        z = F.layer_norm(z, (R,))[:, torch.tensor(c.group_of_layer, device=dev)]
        kv = torch.einsum("bmvr,mrk->mbvk", z, c.to_kv) + c.kv_bias[:, None, None]
        Hkv, d = cfg.teacher_num_kv_heads, cfg.teacher_head_dim
        kv = kv.view(-1, B, k, V, 2, Hkv, d).permute(4, 0, 1, 5, 2, 3, 6).reshape(2, -1, B, Hkv, k * V, d)
        keys = [rotate(model, kv[0, l], pos) for l in range(kv.shape[1])]
        return keys, list(kv[1].unbind(0)), pos


def header_kv(model, prompts):
    h = prompts[0].demo_spans[0][0]
    ids = torch.tensor([p.input_ids[:h] for p in prompts], device=model.device)
    with torch.no_grad():
        out = teacher_forward(model, ids)
    return kv_from_cache(output_cache(out))


def cache_of(model, tr, prompts) -> PrefixCache:
    hk, hv = header_kv(model, prompts)
    keys, values, _ = tr(model, prompts)
    keys = tuple(torch.cat([a, b.to(a.dtype)], dim=2) for a, b in zip(hk, keys))
    values = tuple(torch.cat([a, b.to(a.dtype)], dim=2) for a, b in zip(hv, values))
    B = len(prompts)
    n = torch.tensor([len(p.input_ids) for p in prompts], device=model.device)
    mask = torch.ones(B, keys[0].shape[2], dtype=torch.bool, device=model.device)
    bias = None
    if tr.gate is not None:
        h = hk[0].shape[2]
        bias = torch.cat([tr.gate.new_zeros(h), tr.gate]).to(keys[0].dtype)[None].expand(B, -1)
    return PrefixCache(keys, values, mask, next_position=n, prompt_length=n, bias=bias)


@torch.no_grad()
def dense_tails(model, prompt: Prompt, s: int) -> tuple[Tensor, Tensor]:
    """The dense cache's K (un-rotated) and V at the tail slots: ``(m, H, k*s, d)`` each."""
    full = dense_cache(model, torch.tensor([prompt.input_ids], device=model.device))
    pos = torch.tensor([tail_positions(prompt, s)], device=model.device)
    ks = torch.stack([rotate(model, k[:, :, pos[0]], -pos)[0] for k in full.keys])
    vs = torch.stack([v[0][:, pos[0]] for v in full.values])
    return ks.half().cpu(), vs.half().cpu()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("teacher")
    ap.add_argument("report")
    ap.add_argument("--tail", type=int, default=4)
    ap.add_argument("--control", action="store_true")
    ap.add_argument("--stage1-epochs", type=int, default=2)
    ap.add_argument("--stage2-epochs", type=int, default=2)
    ap.add_argument("--lr1", type=float, default=3e-3)
    ap.add_argument("--lr2", type=float, default=1e-3)
    ap.add_argument("--lambda-rank", type=float, default=1.0)
    ap.add_argument("--lambda-label", type=float, default=0.0, help="KL over the label words (the decision)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gate-init", type=float, default=None,
                    help="gate the slots: a learned attention-logit bias per slot, starting here (G: -4)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model, tok = load_model("smollm2-135m")
    for p in model.parameters():
        p.requires_grad_(False)
    tc = TeacherCache.open(args.teacher)
    eps = json.loads((Path(args.teacher) / "episodes.json").read_text())
    task = get_task("rotten_tomatoes")
    splits = split(task, seed=tc.spec.seed)
    builder = PromptBuilder.for_model(model, tok, task, chat=tc.spec.chat)
    prompts = [builder.build_prefix([splits.pool[i] for i in e["demos"]]) for e in eps]
    episodes = [tc.get(i) for i in range(len(eps))]
    for p, e in zip(prompts, episodes, strict=True):
        assert p.input_ids == e["prompt_ids"].tolist(), "the teacher cache's prompts are not rebuilt"
    t0 = time.time()
    targets_path = out / f"tails{args.tail}.pt"
    if targets_path.exists():
        targets = torch.load(targets_path)
    else:
        targets = [dense_tails(model, p, args.tail) for p in prompts]
        torch.save(targets, targets_path)
    print(f"dense tails: {time.time() - t0:.0f} s", flush=True)
    k = len(prompts[0].demo_spans)
    tr = TailReadout(model, args.tail, args.control, k=k, gate_init=args.gate_init)
    groups: dict[int, list[int]] = {}
    for i, e in enumerate(eps):
        groups.setdefault(e["group"], []).append(i)
    cfg = DistillConfig.recipe(model="smollm2-135m", tasks=["rotten_tomatoes"], k=20)
    history = []
    for stage, epochs, lr in ((1, args.stage1_epochs, args.lr1), (2, args.stage2_epochs, args.lr2)):
        opt = torch.optim.AdamW([p for p in tr.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
        order = list(groups.values())
        total = epochs * len(order)
        step = 0
        for epoch in range(epochs):
            rng = np.random.default_rng(args.seed * 100 + stage * 10 + epoch)
            for gi in rng.permutation(len(order)):
                idx = order[gi]
                for pg in opt.param_groups:
                    warm = min(1.0, (step + 1) / max(1, total // 20))
                    pg["lr"] = lr * warm * 0.5 * (1 + math.cos(math.pi * step / total))
                ps = [prompts[i] for i in idx]
                if stage == 1:
                    keys, values, pos = tr(model, ps)
                    tk = torch.stack([targets[i][0] for i in idx], 1).float()  # (m, B, H, S, d)
                    tv = torch.stack([targets[i][1] for i in idx], 1).float()
                    un = torch.stack([rotate(model, k, -pos) for k in keys])
                    loss = (1 - F.cosine_similarity(un, tk, dim=-1)).mean() + \
                        (1 - F.cosine_similarity(torch.stack(values), tv, dim=-1)).mean()
                    parts = {"kv": float(loss)}
                else:
                    loss, parts = stage2(model, tr, ps, [episodes[i] for i in idx], cfg, args.lambda_rank,
                                         args.lambda_label)
                opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(tr.parameters(), 1.0)
                opt.step()
                history.append({"stage": stage, "step": step, **parts})
                if step % 8 == 0:
                    print(f"stage {stage} step {step}/{total} {parts} {time.time() - t0:.0f} s", flush=True)
                step += 1
    torch.save(tr.state_dict(), out / "readout.pt")
    atomic.write_json(out / "history.json", history)
    evaluate(model, builder, tr, args, out)


def stage2(model, tr, ps, episodes, cfg, lambda_rank, lambda_label=0.0):
    dev = model.device
    S_, Q = len(ps), len(episodes[0]["query_ids"])
    prefix = cache_of(model, tr, ps).repeat_interleave(Q)
    queries = [q for e in episodes for q in e["query_ids"]]
    q_ids, q_mask = (t.to(dev) for t in pad_ids(queries, side="left"))
    o = forward_with_prefix(model, prefix, q_ids, q_mask, output_hidden_states=True, logits_to_keep=1)
    logp = torch.log_softmax(o.logits[:, -1].float(), dim=-1)
    hidden = torch.stack([h[:, -1] for h in o.hidden_states[1:]], dim=1)
    cat = {n: torch.cat([e[n] for e in episodes]).to(dev) for n in ("top_idx", "top_logp", "gold_token", "gold_logp",
                                                                     "hidden")}
    kl = bucket_kl(logp, cat["top_idx"], cat["top_logp"], cfg.temperature).mean()
    hid = hidden_loss(hidden, cat["hidden"]).mean()
    sn = -logp.gather(1, cat["gold_token"][:, None].long())[:, 0].view(S_, Q)
    rank = rank_loss(sn, -cat["gold_logp"].view(S_, Q))
    loss = cfg.lambda_kl * kl + cfg.lambda_hidden * hid + lambda_rank * rank
    parts = {"kl": float(kl), "hidden": float(hid), "rank": float(rank)}
    if lambda_label:
        tokens = torch.cat([e["label_tokens"].expand(Q, -1) for e in episodes]).to(dev)
        lab = label_kl(logp, tokens.long(), torch.cat([e["label_logp"] for e in episodes]).to(dev)).mean()
        loss = loss + lambda_label * lab
        parts["label"] = float(lab)
    return loss, parts


@torch.no_grad()
def evaluate(model, builder, tr, args, out):
    r = json.load(open(args.report))
    cfg = r["config"]
    setting = report_setting(r, model, builder.tokenizer)
    queries, dense, prompts = setting.queries, setting.dense, setting.prompts
    by_ids = {tuple(p.input_ids): p for p in prompts}

    def rows(i, m):
        return [by_ids[tuple(i[b, : int(m[b].sum())].tolist())] for b in range(i.shape[0])]

    def dense_tail(i, m):
        return blocks.dense_tail_cache(model, rows(i, m), i, m, args.tail)

    tr.eval()
    paths = {"dense": lambda i, m: dense_cache(model, i, m), "readout": lambda i, m: cache_of(model, tr, rows(i, m)),
             f"dense tail {args.tail}": dense_tail}
    res = evaluate_paths(model, builder, prompts, queries, paths, loss=cfg["loss"], batch=cfg["batch"],
                            query_batch=cfg["query_batch"])
    full = res["dense"][0].subset_loss().numpy()
    assert np.allclose(full, dense, atol=1e-3), "the report's dense losses are not reproduced"
    labels = [builder.label_index(q) for q in queries]
    report = {"args": vars(args)}
    for name in paths:
        if name == "dense":
            continue
        ev, ag = res[name]
        f = fidelity_report(res["dense"][0], ev, ag, labels=labels)
        lo, hi = spearman_ci(ev.subset_loss().numpy(), dense)
        report[name] = {**f, "subset_loss_spearman_ci95": [lo, hi], "subset_loss": ev.subset_loss().tolist()}
        print(f"{name}: Spearman {f['subset_loss_spearman']:+.2f} [{lo:+.2f}, {hi:+.2f}] KL {f['kl']:.3f} "
              f"rel err {f['rel_logit_err']:.3f} acc {f['acc_compressed']:.3f} (dense {f['acc_dense']:.3f}) "
              f"GFLOP {f['flops_compressed'] / 1e9:.1f} / {f['flops_dense'] / 1e9:.1f}", flush=True)
    atomic.write_json(out / "fidelity.json", report)


if __name__ == "__main__":
    main()

"""BENCHMARKS' 'What the SSM reads, on a language task': which input depth the compressor's SSM should read.

Reads the ``icl-ssm fidelity --also`` reports that set the embeddings (shipped), layers 1, 2 and 8 and the
products of neighbouring tokens beside one control, at k = 20 and 50 on Rotten Tomatoes and ``coin_flip``;
their joined reports (``research/join_reports.py``: paired differences over the same subsets, :func:`minus`);
and the flipped-label probes of ``research/flipped_labels.py`` (:func:`flip`).
"""

from __future__ import annotations

from .base import Records, ci, cite, table
from .fidelity import fidelity


def gflop(report: dict, path: str) -> float:
    """GFLOP per evaluated subset of one path of a fidelity report (``dense`` included)."""
    key = {"dense": "flops_dense", "compressed": "flops_compressed", "control": "control_flops"}.get(path)
    return (report[key] if key else report["also"][path]["flops"]) / 1e9


def spearman_ci(report: dict, path: str, over: str = "_queries") -> str:
    """A path's Spearman with its interval over subsets (``over=""``) or subsets and queries."""
    return (f"{fidelity(report, path, 'subset_loss_spearman'):.2f} "
            f"{ci(fidelity(report, path, 'subset_loss_spearman_ci95' + over))}")


def minus(report: dict, pair: str, both: bool = False) -> str:
    """A paired Spearman difference (``"layer1-control"``) with its interval over subsets, and with
    ``both`` the one over subsets and queries after a semicolon."""
    p = report["paired"][pair]
    lo, hi = (f"{x:+.2f}" for x in p["ci95"])
    inner = f"{lo}, {hi}" + ("; " + ", ".join(f"{x:+.2f}" for x in p["ci95_queries"]) if both else "")
    return f"{p['diff']:+.2f} [{inner}]"


def flip(probe: dict, path: str = "compressed") -> str:
    """The flipped-label probe's loss change of one path with its interval."""
    return f"{probe[path]['diff']:+.3f} {ci(probe[path]['ci95'], '+.3f')}"


def ssm_reads(records: Records) -> str:
    """BENCHMARKS' 'What the SSM reads, on a language task'."""
    page = "[inputs](docs/research/ssm-input.md)"
    k20, layers = records("ssm-input-rotten_tomatoes-k20.json"), records("ssm-input-rotten_tomatoes-k20-layers.json")
    probe = {n: records(f"flipped-rotten_tomatoes-k20-{n}.json")
             for n in ("G-state", "layer8", "layer1", "layer2", "products", "products-512")}
    pairs, pairs512 = (records(f"ssm-input-rotten_tomatoes-k20-{n}.json") for n in ("products", "products-512"))
    big = records("ssm-input-rotten_tomatoes-k50-96x64.json")
    k50 = cite(records, page, "ssm-input-rotten_tomatoes-k50-96x64.json")
    fl = lambda *names: [f"flipped-rotten_tomatoes-k20-{n}.json" for n in names]  # noqa: E731
    rows = [[
        f"subset-loss Spearman vs dense, k = {k20['k']}, {k20['subsets']} x {k20['queries']} [95% CI resampling "
        f"subsets and queries; the shipped G's interval resampling subsets alone is "
        f"{ci(k20['subset_loss_spearman_ci95'])}]", "`icl-ssm fidelity ... --also layer8=DIR`",
        spearman_ci(k20, "compressed"), spearman_ci(k20, "layer8"),
        f"{k20['control_subset_loss_spearman']:.2f}", "above its control by a paired interval",
        cite(records, page, "ssm-input-rotten_tomatoes-k20.json")]]
    rows.append([
        f"KL; accuracy (dense {k20['acc_dense']:.3f}), k = 20", "same",
        *(f"{fidelity(k20, p, 'kl'):.3f}; {fidelity(k20, p, 'acc'):.3f}" for p in ("compressed", "layer8", "control")),
        "—", "same"])
    rows.append([
        f"flipped-label probe, k = 20: loss change (dense {flip(probe['G-state'], 'dense')})",
        "`python research/flipped_labels.py --compressor DIR`", flip(probe["G-state"]), flip(probe["layer8"]), "—",
        "a section-2 prediction tested", cite(records, page, *fl("G-state", "layer8"))])
    rows.append([
        "layers 1 / 2, k = 20: Spearman; minus control [paired CI]; probe loss change",
        "`icl-ssm fidelity ... --also layer1=DIR layer2=DIR`; the probe", "—",
        ". ".join(f"{'layer' if n == 1 else 'Layer'} {n}: {fidelity(layers, f'layer{n}', 'subset_loss_spearman'):.2f}; "
                  f"{minus(layers, f'layer{n}-control')}; {flip(probe[f'layer{n}'])}" for n in (1, 2)),
        "—", "same", cite(records, page, "ssm-input-rotten_tomatoes-k20-layers.json", *fl("layer1", "layer2"))])

    def products(report: dict, path: str, test: dict) -> str:
        return (f"{fidelity(report, path, 'subset_loss_spearman'):.2f}; {minus(report, f'{path}-control')}; "
                f"{flip(test)}; {test['state_separability']['accuracy']:.2f}")

    rows.append([
        "products of neighbouring tokens (`--pair-size 32 --pair-window 48`), k = 20: Spearman; minus control "
        "[paired CI]; probe loss change; state separability "
        f"(G: {probe['G-state']['state_separability']['accuracy']:.2f})",
        "`icl-ssm fidelity ... --also pairs=DIR`; the probe", "—",
        f"{products(pairs, 'pairs', probe['products'])} (CPU, 1 thread). With 512 episodes: "
        f"{products(pairs512, 'pairs512', probe['products-512'])}; KL {fidelity(pairs512, 'pairs512', 'kl'):.3f} "
        "(CPU, 2 threads)", "—", "same",
        cite(records, "[products](docs/research/ssm-input.md#on-rotten-tomatoes-k--20)",
             "ssm-input-rotten_tomatoes-k20-products.json", "ssm-input-rotten_tomatoes-k20-products-512.json",
             *fl("G-state", "products", "products-512"))])
    rows.append([
        f"GFLOP per evaluated subset, k = 20 (dense {gflop(k20, 'dense'):.0f})", "`icl-ssm fidelity`",
        *(f"{gflop(k20, p):.0f}" for p in ("compressed", "layer8", "control")), "<= half the dense",
        cite(records, page, "ssm-input-rotten_tomatoes-k20.json")])
    rows.append([
        f"subset-loss Spearman vs dense, k = {big['k']} (G128's recipe), {big['subsets']} subsets x {big['queries']} "
        "queries [95% CI over subsets]", "`icl-ssm fidelity ... --subsets 96 --queries 64`",
        spearman_ci(big, "compressed", ""), spearman_ci(big, "layer8", ""),
        f"{big['control_subset_loss_spearman']:.2f}", "same", k50])
    rows.append([
        f"minus control, k = 50, {big['subsets']} x {big['queries']} [paired CI over subsets; over subsets and "
        "queries]",
        "same", minus(big, "compressed-control", True), minus(big, "layer8-control", True), "—", "excludes 0", "same"])
    rows.append([
        f"output MSE; KL; accuracy (dense {big['acc_dense']:.3f}), k = 50, {big['subsets']} x {big['queries']}", "same",
        *(f"{fidelity(big, p, 'logit_mse'):.2f}; {fidelity(big, p, 'kl'):.3f}; {fidelity(big, p, 'acc'):.3f}"
          for p in ("compressed", "layer8", "control")), "—", "same"])
    rows += coin_flip_inputs(records)
    rows.append([
        f"GFLOP per evaluated subset, k = 50, {big['queries']} queries, attention counted (dense "
        f"{gflop(big, 'dense'):,.0f})", "`icl-ssm fidelity ... --subsets 96 --queries 64`",
        *(f"{gflop(big, p):,.0f} ({gflop(big, p) / gflop(big, 'dense'):.2f}x)" for p in ("compressed", "layer8")),
        f"{gflop(big, 'control'):,.0f}", "<= half the dense", k50])
    rows.append(layers_k50(records))
    return table(["measure", "command", "embeddings (shipped)", "layer 8", "control", "goal", "record"], rows)


def coin_flip_inputs(records: Records) -> list[list[str]]:
    """`coin_flip` at k = 20 and 50: every input depth against the control."""
    k20 = records("ssm-input-coin_flip-k20.json")
    a, b = records("ssm-input-coin_flip-k50.json"), records("ssm-input-coin_flip-k50-layers28.json")
    joined = records("ssm-input-coin_flip-k50-joined.json")  # the paired differences of every depth, one control
    dense20 = gflop(k20, "dense")

    def depth20(n: int) -> str:
        return (f"{fidelity(k20, f'layer{n}', 'subset_loss_spearman'):.2f}; {minus(k20, f'layer{n}-control')}; "
                f"{fidelity(k20, f'layer{n}', 'logit_mse'):.2f}")

    def depth50(report: dict, path: str, name: str, interval: bool = False) -> str:
        value = spearman_ci(report, path, "") if interval else f"{fidelity(report, path, 'subset_loss_spearman'):.2f}"
        g = gflop(report, path)
        return (f"{value}; {minus(joined, f'{name}-control')}; {fidelity(report, path, 'logit_mse'):.2f}; "
                f"{fidelity(report, path, 'kl'):.3f}; {g:.0f} ({g / gflop(report, 'dense'):.2f}x)")

    rows = [[
        f"`coin_flip`, k = 20 (default recipe, {k20['subsets']} x {k20['queries']}): Spearman [95% CI]; minus control "
        "[paired CI]; output MSE; KL",
        "`icl-ssm fidelity --task coin_flip --k 20 ... --also layer1=DIR layer2=DIR layer8=DIR`",
        f"{spearman_ci(k20, 'compressed', '')}; {minus(k20, 'compressed-control')}; {k20['logit_mse']:.2f}; "
        f"{k20['kl']:.3f}",
        f"layer 1: {depth20(1)}. Layer 2: {depth20(2)}. Layer 8: {spearman_ci(k20, 'layer8', '')}; "
        f"{minus(k20, 'layer8-control')}; {fidelity(k20, 'layer8', 'logit_mse'):.2f}; "
        f"{fidelity(k20, 'layer8', 'kl'):.3f} ({gflop(k20, 'layer8') / dense20:.2f}x the dense FLOPs)",
        f"{k20['control_subset_loss_spearman']:.2f}; {k20['control_logit_mse']:.2f}; {k20['control_kl']:.3f} "
        f"(window {k20['window_subset_loss_spearman']:.2f})",
        "excludes 0",
        cite(records, "[coin_flip](docs/research/ssm-input.md#coin_flip-k--20-every-input-depth-against-the-control)",
             "ssm-input-coin_flip-k20.json")]]
    assert not any(joined["drift"].values())  # the dense, control and window losses of the two runs agree
    rows.append([
        f"`coin_flip`, k = 50 (default recipe, {a['subsets']} x {a['queries']}; dense split-half "
        f"{a['dense_split_half_spearman']:.2f}): Spearman [95% CI]; minus control [paired CI over subsets]; output "
        f"MSE; KL; GFLOP per subset (dense {gflop(a, 'dense'):,.0f})",
        "`icl-ssm fidelity --task coin_flip --k 50 ... --also layer1=DIR`; `python research/join_reports.py`",
        depth50(a, "compressed", "compressed", True),
        f"layer 1: {depth50(a, 'layer1', 'layer1')}. Layer 2: {depth50(b, 'compressed', 'layer2')}. "
        f"Layer 8: {depth50(b, 'layer8', 'layer8', True)}",
        f"{a['control_subset_loss_spearman']:.2f}; {a['control_logit_mse']:.2f}; {a['control_kl']:.3f} "
        f"(window {a['window_subset_loss_spearman']:.2f})",
        "excludes 0",
        cite(records, "[coin_flip k = 50](docs/research/ssm-input.md"
                      "#coin_flip-k--50-every-input-depth-against-the-control)",
             "ssm-input-coin_flip-k50.json", "ssm-input-coin_flip-k50-layers28.json",
             "ssm-input-coin_flip-k50-joined.json")])
    return rows


def layers_k50(records: Records) -> list[str]:
    """Layers 1 and 2 at k = 50 on 64 x 64, joined with G128 and layer 8 on the same 64 subsets."""
    r, joined = records("ssm-input-rotten_tomatoes-k50-layers12-64x64.json"), records(
        "ssm-input-rotten_tomatoes-k50-joined-64x64.json")
    assert not any(joined["drift"].values())  # the dense, control and window losses of the two runs agree
    control = r["control_subset_loss_spearman"]
    # G128's and layer 8's Spearman on these 64 subsets: the control's plus their paired difference with it
    on64 = {p: control + joined["paired"][f"{p}-control"]["diff"] for p in ("compressed", "layer8")}

    def depth(path: str, name: str) -> str:
        g = gflop(r, path)
        return (f"{spearman_ci(r, path, '')}; {minus(joined, f'{name}-control', True)}; "
                f"{fidelity(r, path, 'logit_mse'):.2f}; {fidelity(r, path, 'kl'):.3f}; {g:.0f} "
                f"({g / gflop(r, 'dense'):.2f}x)")

    return [
        f"layers 1 / 2, k = 50, {r['subsets']} x {r['queries']} (the first {r['subsets']} of the 96 subsets; trained "
        "on one H100): Spearman [95% CI]; minus control [paired CI over subsets; and queries]; output MSE; KL; GFLOP "
        "per subset",
        "`icl-ssm fidelity ... --compressor layer1=DIR --also layer2=DIR --subsets 64`; "
        "`python research/join_reports.py`",
        f"on these {r['subsets']}: {on64['compressed']:.2f}; {minus(joined, 'compressed-control', True)}",
        f"layer 1: {depth('compressed', 'layer1')}. Layer 2: {depth('layer2', 'layer2')}. Layer 8 on these "
        f"{r['subsets']}: {on64['layer8']:.2f}; {joined['paired']['layer8-control']['diff']:+.2f}",
        f"{control:.2f}; {r['control_logit_mse']:.2f}; {r['control_kl']:.3f}",
        "excludes 0",
        cite(records, "[layers 1 and 2](docs/research/ssm-input.md"
                      "#layers-1-and-2-at-k--50-trained-on-one-h100-evaluated-on-the-cpu)",
             "ssm-input-rotten_tomatoes-k50-layers12-64x64.json", "ssm-input-rotten_tomatoes-k50-joined-64x64.json")]

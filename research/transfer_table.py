"""The cross-task transfer table from the reports of ``research/transfer_nv_inputs.sh OUT transfer``.

    python research/transfer_table.py OUT [--tasks T1 T2 ...]

Reads ``OUT/transfer-<task>.json`` (one fidelity report per target task, holding the native
compressor, the ``from-<source>`` compressors carried there by stage 2 and the ``as-is-<source>``
ones used unchanged) and ``OUT/times.tsv`` (each run's wall time), and prints two Markdown
tables: KL to the dense answers / output MSE over the vocabulary / accuracy per compressor (rows)
and target task (columns), and the training time of each transfer against the native
compressor of its target (stage 2 alone against both stages). A cell is empty where its run has
not finished; a report that is missing leaves its column empty.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

TASKS = ("rotten_tomatoes", "cr", "coin_flip", "modular_addition")


def _cell(kl: float, mse: float, acc: float) -> str:
    return f"{kl:.3f} / {mse:.1f} / {acc:.3f}"


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def fidelity_table(reports: dict[str, dict], tasks: tuple[str, ...]) -> list[str]:
    """Rows: native, from each source, each source as it is, the window; columns: target tasks."""
    head = [f"{t} (dense {reports[t]['acc_dense']:.3f})" if t in reports else t for t in tasks]
    lines = [_row(["compressor", *head]), "|---|" + "---|" * len(tasks)]
    native = [_cell(r["kl"], r["logit_mse"], r["acc_compressed"]) if (r := reports.get(t)) else "" for t in tasks]
    lines.append(_row(["native (both stages on the task)", *native]))
    for kind, label in (("from", "from {} (stage 2 here)"), ("as-is", "{}, as it is")):
        for source in tasks:
            cells = []
            for target in tasks:
                other = reports.get(target, {}).get("also", {}).get(f"{kind}-{source}")
                cells.append("—" if source == target else _cell(other["kl"], other["logit_mse"], other["acc"])
                             if other else "")
            lines.append(_row([label.format(source), *cells]))
    window = [f"{r['window_kl']:.3f} / — / {r['window_acc']:.3f}" if (r := reports.get(t)) else "" for t in tasks]
    lines.append(_row(["window (sinks + the last tokens, same size)", *window]))
    return lines


def time_table(seconds: dict[str, float], tasks: tuple[str, ...]) -> list[str]:
    """Per target: the native's training seconds, each transfer's, and the share it saves."""
    lines = [_row(["target", "native (s)", "transfers into it (s)", "saved"]), "|---|---:|---|---:|"]
    for target in tasks:
        native = seconds.get(f"native-{target}")
        into = [seconds[f"xfer-{s}-to-{target}"] for s in tasks if f"xfer-{s}-to-{target}" in seconds]
        if native is None or not into:
            continue
        saved = [1 - t / native for t in into]
        lines.append(_row([target, f"{native:.0f}", ", ".join(f"{t:.0f}" for t in into),
                           f"{min(saved):.0%} to {max(saved):.0%}"]))
    return lines


def read_times(path: Path) -> dict[str, float]:
    """``times.tsv`` rows ``NAME<TAB>SECONDS<TAB>STATUS``: the last successful run of each name."""
    seconds: dict[str, float] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            name, wall, status = line.split("\t")
            if status == "0":
                seconds[name] = float(wall)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the OUT directory of transfer_nv_inputs.sh")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS))
    args = parser.parse_args()
    if not args.out.is_dir():
        parser.error(f"OUT {str(args.out)!r} is not a directory")
    tasks = tuple(args.tasks)
    reports = {t: json.loads(p.read_text()) for t in tasks if (p := args.out / f"transfer-{t}.json").is_file()}
    print("\n".join(fidelity_table(reports, tasks)))
    print()
    print("\n".join(time_table(read_times(args.out / "times.tsv"), tasks)))


if __name__ == "__main__":
    main()

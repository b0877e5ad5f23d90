"""``icl-ssm answer``: parse the flags into an :class:`~icl_ssm.apply.answer_file.AnswerConfig`, check
it (:func:`~icl_ssm.apply.answer_file.plan_answer`) before loading the model, answer
(:func:`~icl_ssm.apply.answer_file.run_answer`) and print the summary. SIGTERM stops it like Ctrl-C:
the batches answered so far stay in the partial file, and the same command continues."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from dataclasses import fields

from icl_ssm.apply.answer import CACHES, CALIBRATION_INPUTS, MIN_BATCH_INPUTS, RETRIEVERS, cache_kind
from icl_ssm.apply.answer_file import CALIBRATE, AnswerConfig, plan_answer, run_answer, summary_lines
from icl_ssm.cli.options import parse_options

INPUT_OPTIONS = ("input_field", "label_field", "target_field", "id_field")


def cache_name(value: str) -> str:
    """``--cache``'s value (:func:`~icl_ssm.apply.answer.cache_kind`: ``exact`` reads as ``dense``)."""
    try:
        return cache_kind(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}; accepted: {', '.join(CACHES)}") from None


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _main(args: argparse.Namespace) -> int:
    options = parse_options(args.option)
    unknown = sorted(set(options) - set(INPUT_OPTIONS))
    if unknown:
        raise ValueError(f"-o {', '.join(unknown)}: the inputs file takes {', '.join(INPUT_OPTIONS)}")
    if "target_field" in options:
        options["label_field"] = options.pop("target_field")
    cfg = AnswerConfig(**{f.name: getattr(args, f.name) for f in fields(AnswerConfig) if hasattr(args, f.name)},
                       **options)
    plan = plan_answer(cfg)
    for line in plan.notes + ([plan.fidelity] if plan.fidelity else []):
        print(f"icl-ssm answer: {line}", file=sys.stderr)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from icl_ssm.compress.compressor import load_compressor
    from icl_ssm.lm.models import load_model

    model, tokenizer = load_model(plan.model)
    compressor = load_compressor(plan.compressor, model.config).to(model.device) if plan.compressor else None
    stderr = Console(stderr=True)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with Progress(TextColumn("answer"), BarColumn(), MofNCompleteColumn(), TextColumn("inputs"),
                      TimeRemainingColumn(), console=stderr, transient=True) as bar:
            job = bar.add_task("inputs", total=len(plan.inputs))
            summary = run_answer(plan, args.out, model, tokenizer, compressor,
                                 progress=lambda n: bar.advance(job, n))
    finally:
        signal.signal(signal.SIGTERM, previous)
    if args.json:
        print(json.dumps(summary, indent=1))
        return 0
    for line in summary_lines(summary):
        print(f"icl-ssm answer: {line}", file=sys.stderr)
    print(f"{args.out}/predictions.jsonl")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("answer", help="answer a file of inputs with a selection's prompt, its prefix encoded once",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    d = AnswerConfig()
    p.add_argument("selection", help="the --out directory of icl-ssm select or icl-ssm run (or its selected.jsonl)")
    p.add_argument("inputs", help="a .jsonl, .csv or .tsv file: one input a line, with or without its label")
    p.add_argument("--out", required=True,
                   help="directory for predictions.jsonl and answer_summary.json; a rerun continues it")
    p.add_argument("--model", default=d.model,
                   help="the selection's model (default); another is refused: a prompt is chosen for one model")
    p.add_argument("--task", default=d.task, help="only for a selected.jsonl with no configuration beside it")
    p.add_argument("--cache", default=d.cache, type=cache_name, metavar="{" + ",".join(CACHES) + "}",
                   help="the prefix shared by every input: dense (the model's own K/V: the dense prompt's answers) or "
                        "compressed (the selection's compressor, refused unless its fidelity verdict passed)")
    p.add_argument("--compressor", default=d.compressor,
                   help="--cache compressed: a compressor directory (default: the selection's, else the shipped one)")
    p.add_argument("--force", action="store_true",
                   help="--cache compressed with a compressor whose fidelity verdict did not pass")
    p.add_argument("--per-query", default=d.per_query, choices=RETRIEVERS,
                   help="retrieve k demonstrations from the selection's pool for each input instead (OpenICL-style)")
    p.add_argument("--k", type=int, default=d.k,
                   help="--per-query: demonstrations per input (default: the selection's)")
    p.add_argument("--batch", type=int, default=d.batch, help="inputs answered together")
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens, help="generative tasks: longest answer")
    p.add_argument("--calibrate", default=d.calibrate, choices=CALIBRATE,
                   help="the label-score calibration: selection (the bias saved with the selection, none if it has "
                        "none), none (raw scores), or one estimated now: batch (the mean label log-probability over "
                        f"the first {CALIBRATION_INPUTS} inputs; at least {MIN_BATCH_INPUTS}; it assumes their labels "
                        "are roughly balanced), contextual (content-free inputs) or domain (random in-domain words)")
    p.add_argument("--no-zero-shot", dest="zero_shot", action="store_false",
                   help="labelled inputs: do not answer them with no demonstrations beside the prompt")
    p.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE",
                   help="the inputs file's fields: input_field=, label_field=, id_field= (default: the selection's "
                        "task file's, else text and label)")
    p.add_argument("--skip-empty", action="store_true",
                   help="skip rows whose text or label is empty (their lines are reported) instead of refusing "
                        "the file")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.set_defaults(func=_main)

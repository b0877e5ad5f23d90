"""docs/robustness.md's table, and BENCHMARKS' copy: the generated-input tests' long profile and the SIGKILL
harness, each against its target, read through the one adapter (:mod:`.readers.robustness`) from
``fuzz-inputs-long.json`` (``tools/fuzz_inputs.sh``) and ``kill-resume.json`` (``tools/kill_resume.py``) and
rendered by the one renderer, a row per record."""

from __future__ import annotations

from icl_ssm.records import Record

from .adapt import read
from .base import Records
from .render import Column, render

FUZZ, KILLS = "fuzz-inputs-long.json", "kill-resume.json"
FUZZ_TARGET, KILL_TARGET = 1000, 20


def _fuzz(r: Record) -> bool:
    return r["total"].value >= FUZZ_TARGET and r["failed"].value == 0 and r["exit_status"].value == 0


def _kills(r: Record) -> bool:
    return (r["kills"].value >= KILL_TARGET and r["identical_after_a_kill"].value == r["kills"].value
            and r["reruns_completed"].value == r["attempts"].value)


def _target(r: Record) -> str:
    if r.name == FUZZ:
        return (f">= {FUZZ_TARGET} generated inputs (task files, flag values, selection and compressor folders): each "
                "a result or one error naming the input; no traceback")
    return (f">= {KILL_TARGET} SIGKILLs at random points of `run`, `select`, `answer`, `distill`: the same command "
            "again completes, its outputs those of an uninterrupted run")


def _command(r: Record) -> str:
    return f"`{r.config['command']}`" + (" (`tools/fuzz_inputs.sh`)" if r.name == FUZZ else "")


def _machine(r: Record) -> str:
    machine = r.provenance["process"]["machine"]
    if r.name == FUZZ:
        return machine
    return f"{machine.split(',')[0]}, cpu; each command in a subprocess on 1 torch thread"


def _measured(r: Record) -> str:
    v = lambda key: r[key].value  # noqa: E731
    if r.name == FUZZ:
        by_kind = "; ".join(f"{kind}: {v(f'{kind}.result')} results, {v(f'{kind}.error')} refusals"
                            for kind in r.config["kinds"])
        return (f"{v('total')} cases, {v('failed')} failed ({by_kind}): "
                + ("met" if _fuzz(r) else "**not met**"))
    each = "; ".join(f"`{c}` {v(f'{c}.same')} of {v(f'{c}.kills')} (killed {v(f'{c}.delay_min'):.1f}-"
                     f"{v(f'{c}.delay_max'):.1f} s in, uninterrupted {v(f'{c}.uninterrupted'):.1f} s)"
                     for c in r.config["commands"])
    return (f"{v('kills')} kills: {v('reruns_completed')} of {v('attempts')} reruns completed, "
            f"{v('identical_after_a_kill')} of {v('kills')} identical ({each}): "
            + ("met" if _kills(r) else "**not met**"))


def robustness(records: Records, depth: int = 1) -> str:
    """The two targets, measured; ``depth``: the page's folders below the root (its record links)."""
    rows = [read(records, name) for name in (FUZZ, KILLS)]
    columns = [Column("target", cell=_target), Column("command", cell=_command), Column("machine", cell=_machine),
               Column("measured", cell=_measured), Column("record", cell=lambda r: records.link(r.name, depth))]
    return render(rows, columns)

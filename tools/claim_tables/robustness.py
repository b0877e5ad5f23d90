"""docs/robustness.md's table, and BENCHMARKS' copy: the generated-input tests' long profile and the SIGKILL
harness, each against its target, read from ``fuzz-inputs-long.json`` (``tools/fuzz_inputs.sh``) and
``kill-resume.json`` (``tools/kill_resume.py``)."""

from __future__ import annotations

from .base import Records, table

FUZZ, KILLS = "fuzz-inputs-long.json", "kill-resume.json"
FUZZ_TARGET, KILL_TARGET = 1000, 20


def robustness(records: Records, depth: int = 1) -> str:
    """The two targets, measured; ``depth``: the page's folders below the root (its record links)."""
    fuzz, kills = records(FUZZ), records(KILLS)
    cases = fuzz["cases"]
    by_kind = "; ".join(f"{name}: {c['result']} results, {c['error']} refusals" for name, c in cases.items())
    fuzz_ok = fuzz["total"] >= FUZZ_TARGET and fuzz["failed"] == 0 and fuzz["exit_status"] == 0
    s = kills["summary"]
    per = {}
    for k in kills["kills"]:
        row = per.setdefault(k["command"], {"kills": 0, "same": 0, "delays": []})
        row["kills"] += bool(k["killed"])
        row["same"] += bool(k["killed"]) and not k["differences"] and k["rerun_exit"] == 0
        row["delays"].append(k["delay_seconds"])
    kill_ok = s["kills"] >= KILL_TARGET and s["identical_after_a_kill"] == s["kills"] and \
        s["reruns_completed"] == s["attempts"]
    each = "; ".join(f"`{c}` {r['same']} of {r['kills']} (killed {min(r['delays']):.1f}-{max(r['delays']):.1f} s in, "
                     f"uninterrupted {kills['uninterrupted'][c]['seconds']:.1f} s)" for c, r in per.items())
    rows = [
        [f">= {FUZZ_TARGET} generated inputs (task files, flag values, selection and compressor folders): each a "
         "result or one error naming the input; no traceback",
         f"`{fuzz['provenance']['command']}` (`tools/fuzz_inputs.sh`)", fuzz["provenance"]["machine"],
         f"{fuzz['total']} cases, {fuzz['failed']} failed ({by_kind}): " + ("met" if fuzz_ok else "**not met**"),
         records.link(FUZZ, depth)],
        [f">= {KILL_TARGET} SIGKILLs at random points of `run`, `select`, `answer`, `distill`: the same command again "
         "completes, its outputs those of an uninterrupted run",
         f"`{kills['provenance']['command']}`",
         f"{kills['provenance']['machine'].split(',')[0]}, cpu; each command in a subprocess on 1 torch thread",
         f"{s['kills']} kills: {s['reruns_completed']} of {s['attempts']} reruns completed, "
         f"{s['identical_after_a_kill']} of {s['kills']} identical ({each}): " + ("met" if kill_ok else "**not met**"),
         records.link(KILLS, depth)],
    ]
    return table(["target", "command", "machine", "measured", "record"], rows)

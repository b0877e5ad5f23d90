"""The robustness harnesses' records: the generated-input tests (``fuzz-inputs-*.json``, ``tools/fuzz_inputs.sh``)
and the SIGKILL harness (``kill-resume.json``, ``tools/kill_resume.py``)."""

from __future__ import annotations

from typing import Any

from icl_ssm.records import Metric, Record


def fuzz_inputs(raw: dict[str, Any], name: str) -> Record:
    """A run of the generated-input tests: how many cases ran (``total``) and failed (``failed``), the
    pytest exit status (``exit_status``), and per kind of input (``task files.result``, ``task files.error``)
    how many ended in a result and how many in one error naming the input. Counts, no intervals; config
    ``kinds``: the kinds of input in the record's order."""
    cases = raw.get("cases") or {}
    metrics = {"total": Metric(raw.get("total"), unit="count"), "failed": Metric(raw.get("failed"), unit="count"),
               "exit_status": Metric(raw.get("exit_status"), unit="exit status")}
    for kind, c in cases.items():
        metrics[f"{kind}.result"] = Metric(c.get("result"), unit="count")
        metrics[f"{kind}.error"] = Metric(c.get("error"), unit="count")
    prov = raw.get("provenance") or {}
    config = {"command": prov.get("command"), "kinds": list(cases), "passing": raw.get("what_passing_means")}
    return Record({"process": raw.get("provenance")}, config, metrics, {}, name)


def kill_resume(raw: dict[str, Any], name: str) -> Record:
    """A run of the SIGKILL harness: the summary counts (``kills``, ``attempts``, ``reruns_completed``,
    ``identical``, ``identical_after_a_kill``) and per command killed (``select.kills``): how many attempts
    killed it, how many of those its rerun completed with the outputs of an uninterrupted run (``same``), the
    earliest and latest kill (``delay_min``, ``delay_max``, seconds in) and the uninterrupted run's seconds
    (``uninterrupted``). Counts and seconds, no intervals; config ``commands``: in the order first killed."""
    s = raw.get("summary") or {}
    metrics = {key: Metric(s.get(key), unit="count")
               for key in ("kills", "attempts", "reruns_completed", "identical", "identical_after_a_kill")}
    per: dict[str, dict[str, Any]] = {}
    for k in raw.get("kills") or []:
        row = per.setdefault(k["command"], {"kills": 0, "same": 0, "delays": []})
        row["kills"] += bool(k["killed"])
        row["same"] += bool(k["killed"]) and not k["differences"] and k["rerun_exit"] == 0
        row["delays"].append(k["delay_seconds"])
    for command, row in per.items():
        metrics |= {f"{command}.kills": Metric(row["kills"], n=len(row["delays"]), unit="count"),
                    f"{command}.same": Metric(row["same"], n=row["kills"], unit="count"),
                    f"{command}.delay_min": Metric(min(row["delays"]), unit="seconds"),
                    f"{command}.delay_max": Metric(max(row["delays"]), unit="seconds"),
                    f"{command}.uninterrupted": Metric(
                        ((raw.get("uninterrupted") or {}).get(command) or {}).get("seconds"), unit="seconds")}
    prov = raw.get("provenance") or {}
    config = {**(raw.get("settings") or {}), "command": prov.get("command"), "commands": list(per)}
    return Record({"process": raw.get("provenance")}, config, metrics, {}, name)


FAMILIES = {"fuzz-inputs-": fuzz_inputs, "kill-resume": kill_resume}

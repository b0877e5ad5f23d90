"""The one adapter from the records stored before the record schema (:mod:`icl_ssm.records`) to it.

:func:`as_record` returns a :class:`~icl_ssm.records.Record` for a record of the schema (read as it is)
or of a family listed in :data:`FAMILIES` (gathered from the modules of :mod:`.readers`), whose
statistics it takes from the stored record and names: each metric's value, its interval and what the
interval resamples, the count it rests on. A family is named by the start of its records' names under
``docs/results/``; a record of any other family is refused, naming it. A family joins by a module in
``readers/`` with its reader and ``FAMILIES``; its tables then render through
:func:`claim_tables.render.render`. :func:`read` is how a table reads one record by name.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import Any

from icl_ssm.records import SCHEMA, Record

from . import readers
from .base import Records


def _gather() -> dict[str, Callable[[dict[str, Any], str], Record]]:
    """Every reader module's ``FAMILIES``, refusing a start two modules claim or one start that begins another."""
    families: dict[str, Callable[[dict[str, Any], str], Record]] = {}
    owner: dict[str, str] = {}
    for info in sorted(pkgutil.iter_modules(readers.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{readers.__name__}.{info.name}")
        for start, reader in getattr(module, "FAMILIES", {}).items():
            clash = next((s for s in families if s.startswith(start) or start.startswith(s)), None)
            if clash is not None:
                raise ValueError(f"readers.{info.name} names the family {start!r}, which overlaps "
                                 f"{clash!r} of readers.{owner[clash]}")
            families[start], owner[start] = reader, info.name
    return families


# a family: the start of its records' names under docs/results/, and its reader
FAMILIES = _gather()


def as_record(name: str, raw: dict[str, Any] | list) -> Record:
    """``raw`` (the JSON stored at ``docs/results/<name>``: an object, or an older record's list of
    runs) as a :class:`Record`."""
    if isinstance(raw, dict) and raw.get("schema") == SCHEMA:
        return Record.from_dict(raw, name)
    family = next((start for start in FAMILIES if name.startswith(start)), None)
    if family is None:
        raise ValueError(f"record {name!r}: neither of the record schema ({SCHEMA}) nor of a family the adapter "
                         f"reads ({', '.join(FAMILIES)}); add its reader under tools/claim_tables/readers/")
    return FAMILIES[family](raw, name)


def read(records: Records, name: str) -> Record:
    """The record stored at ``docs/results/<name>`` as a :class:`Record`: read by ``records`` (which checks its
    provenance and notes that the table read it), then by :func:`as_record`."""
    return as_record(name, records(name))

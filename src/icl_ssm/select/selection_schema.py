"""The JSON layouts a saved selection is read from: ``selection.json``
(:data:`SELECTION_SCHEMA`, what :meth:`~icl_ssm.select.selected.SelectedPrompt.to_dict`
writes, at version :data:`FORMAT`), the files ``icl-ssm select`` and ``icl-ssm run`` wrote before
it existed (:data:`SELECT_CONFIG_SCHEMA`, :data:`RUN_CONFIG_SCHEMA`, :data:`SUMMARY_SCHEMA`,
:data:`REPORT_SCHEMA`: only the fields read from them) and a shipped compressor's
``recipe.json`` (:data:`RECIPE_SCHEMA`). Each is checked by :func:`icl_ssm.schema.validate`."""

from __future__ import annotations

from icl_ssm import schema
from icl_ssm.data.tasks import KINDS

SELECTION_FILE = "selection.json"
FORMAT = 1  # version of selection.json's layout
TEMPLATE_FIELDS = ("kind", "labels", "verbalizers", "instruction", "input_prefix", "output_prefix")

_TEXT = {"type": "string", "minLength": 1}
TEMPLATE_SCHEMA = schema.record({
    "kind": {"enum": list(KINDS)}, "labels": {"type": "array", "items": schema.STRING},
    "verbalizers": {"type": "object", "additionalProperties": schema.STRING}, "instruction": schema.STRING,
    "input_prefix": schema.STRING, "output_prefix": schema.STRING}, closed=True)
POOL_SCHEMA = schema.record({"size": schema.POSITIVE, "seed": schema.COUNT, "k": schema.COUNT,
                             "min_validation": schema.COUNT, "ids_sha256": schema.STRING},
                            required=("size", "seed"), closed=True)
SELECTION_SCHEMA = schema.record({
    "format": {"const": FORMAT}, "model": _TEXT, "task": _TEXT,
    "demonstrations": {"type": "array", "items": schema.record(
        {"id": schema.STRING, "text": schema.STRING, "label": schema.STRING,
         "pool_index": schema.nullable(schema.COUNT)}, required=("id", "text", "label"), closed=True)},
    "task_options": schema.OBJECT, "template": TEMPLATE_SCHEMA, "chat": schema.BOOLEAN,
    "pool": schema.nullable(POOL_SCHEMA), "compressor": schema.nullable(_TEXT),
    "fidelity": schema.nullable(schema.record({"verdict": schema.nullable(schema.STRING), "detail": schema.STRING,
                                               "source": schema.nullable(schema.STRING)}, closed=True)),
    "method": schema.nullable(schema.STRING), "calibration": schema.nullable(schema.OBJECT),
}, required=("format", "model", "task", "demonstrations"), closed=True)
"""``selection.json``: what :meth:`~icl_ssm.select.selected.SelectedPrompt.to_dict` writes (the calibration's own fields
are checked by :meth:`~icl_ssm.calibrate.Calibration.from_dict`)."""

# the fields read from the files icl-ssm select and icl-ssm run wrote before selection.json
_COMMON = {"model": _TEXT, "task": _TEXT, "task_options": schema.OBJECT, "pool_size": schema.POSITIVE,
           "seed": schema.COUNT, "k": schema.POSITIVE, "queries": schema.COUNT, "confirm_queries": schema.COUNT,
           "screen_queries": schema.COUNT, "check_size": schema.COUNT}
SELECT_CONFIG_SCHEMA = schema.record({**_COMMON, "method": schema.STRING, "screen": schema.STRING,
                                      "evaluator": schema.nullable(schema.STRING), "chat": schema.BOOLEAN,
                                      "compressor": schema.nullable(_TEXT)})
RUN_CONFIG_SCHEMA = schema.record({**_COMMON, "methods": {"type": "array", "items": schema.STRING}})
SUMMARY_SCHEMA = schema.record({"ids": {"type": "array", "items": schema.STRING}, "indices": schema.INDICES})
REPORT_SCHEMA = schema.record({
    "handed_over": schema.record({"indices": schema.INDICES, "name": schema.nullable(schema.STRING)}),
    "compressor": schema.nullable(schema.record({"compressor": schema.nullable(_TEXT)})),
    "fidelity_verdict": schema.nullable(schema.OBJECT)})
RECIPE_SCHEMA = schema.record({"k": schema.POSITIVE, "fidelity": schema.nullable(schema.OBJECT)})

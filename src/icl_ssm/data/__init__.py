"""Tasks and their data: the registry (:mod:`.tasks`), the built-in tasks (hub, offline and
generated), the readers of a user's own files, and the pool / validation / test splits.

Importing this package registers every built-in task in :data:`~icl_ssm.data.tasks.TASKS`,
in the order ``icl-ssm data list`` shows them.

Imports only the top-level helpers (``atomic``, ``cost``, ``lock``, ``provenance``, ``schema``);
never a model, a cache or anything built on them (``tests/test_layout.py``)."""

# isort: off
from icl_ssm.data import hub  # noqa: F401  (each module registers its tasks)
from icl_ssm.data import offline  # noqa: F401
from icl_ssm.data import generated  # noqa: F401
from icl_ssm.data import readers  # noqa: F401
# isort: on

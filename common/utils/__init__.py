"""Shared utilities for the domain packages: seeding, checkpoints, atomic writes, paths,
metrics logging and results records (``distributed`` is imported on demand). Each name imports its
submodule on first use (:mod:`common.lazy`)."""
from common.lazy import lazy_exports

_EXPORTS = {"Checkpointer": "checkpoint", "average_checkpoints": "checkpoint", "atomic_save": "io",
            "atomic_save_figure": "io", "atomic_write_json": "io", "atomic_write_text": "io", "MetricsLogger": "logger",
            "read_metrics": "logger", "DataRootError": "paths", "cache_dir": "paths",
            "default_data_root": "paths", "environment": "results", "git_commit": "results",
            "results_record": "results", "seed_everything": "seed"}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

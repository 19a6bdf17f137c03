"""Shared utilities for the domain packages: seeding, checkpoints, atomic writes, paths,
metrics logging and results records (``distributed`` is imported on demand)."""
from .checkpoint import Checkpointer
from .io import atomic_save, atomic_save_figure, atomic_write_json, atomic_write_text
from .logger import MetricsLogger, read_metrics
from .paths import DataRootError, cache_dir, default_data_root
from .results import environment, git_commit, results_record
from .seed import seed_everything

__all__ = [
    "Checkpointer", "DataRootError", "MetricsLogger", "atomic_save", "atomic_save_figure", "atomic_write_json", "atomic_write_text", "cache_dir",
    "default_data_root", "environment", "git_commit", "read_metrics", "results_record", "seed_everything",
]

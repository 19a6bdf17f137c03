"""Shared utilities for the domain packages: seeding, atomic writes, paths and results records."""
from .io import atomic_save, atomic_write_json, atomic_write_text
from .paths import cache_dir, default_data_root
from .results import environment, git_commit, results_record
from .seed import seed_everything

__all__ = [
    "atomic_save", "atomic_write_json", "atomic_write_text", "cache_dir", "default_data_root",
    "environment", "git_commit", "results_record", "seed_everything",
]

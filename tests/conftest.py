"""Shared test fixtures.

``attn_data_root``: the real data directory from ``ATTN_DATA_ROOT`` (absolute path of the
shared data, see its README). Tests that use it are marked ``@pytest.mark.realdata``; they
skip with the reason when the directory is absent, except under ``CI=true``, where a missing
data root is a failure (CI must never silently skip the real-data tests).

Without CUDA, ``TRITON_INTERPRET=1`` is set before any kernel module is imported, so the
Triton kernels of ``common.attention.kernels`` run (slowly) in Triton's CPU interpreter.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

# Triton kernels run in Triton's CPU interpreter when there is no GPU. Triton reads this when a
# kernel module is imported, so it is set before any test imports one.
try:
    import torch as _torch

    if not _torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
except ImportError:  # pragma: no cover - torch is a requirement
    pass


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` (tests/gpu) skip where there is no CUDA GPU."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none here)")
    for item in items:
        if item.get_closest_marker("cuda"):
            item.add_marker(skip)


@pytest.fixture
def one_thread():
    """One torch thread for the test, restored afterwards: tiny models run fastest that way on a
    shared CPU (no OpenMP contention). Domain conftests make it autouse for their tests."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def ctrl_c_on_call(monkeypatch, request):
    """``restore = ctrl_c_on_call(owner, "name", n)``: the ``n``-th call of ``owner.name`` sends
    this process SIGINT (a Ctrl-C) before it runs; ``restore()`` puts the original back. A suite started in
    the background by a shell without job control inherits SIGINT ignored: Python's Ctrl-C handler is put
    back for the test, so that it sees the KeyboardInterrupt a terminal would give."""
    import signal

    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        request.addfinalizer(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))

    def patch(owner, name: str, n: int):
        original, calls = getattr(owner, name), []

        def interrupting(*args, **kwargs):
            calls.append(1)
            if len(calls) == n:
                os.kill(os.getpid(), signal.SIGINT)
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, interrupting)
        return lambda: monkeypatch.setattr(owner, name, original)
    return patch


@pytest.fixture(scope="session")
def attn_data_root() -> Path:
    value = os.environ.get("ATTN_DATA_ROOT")
    if value and Path(value).is_dir():
        return Path(value)
    reason = ("ATTN_DATA_ROOT is not set" if not value else f"ATTN_DATA_ROOT={value} is not a directory")
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason}, but CI=true: real-data tests must run in CI; export ATTN_DATA_ROOT as the "
                    f"absolute path of the shared data directory")
    pytest.skip(f"{reason}; point it at the shared data directory to run the real-data tests")

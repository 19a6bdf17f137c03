"""benchmarks/busy_cpu.py (no timing here): its commands are valid command lines of their CLIs, with config keys
those CLIs know, and its load really occupies the cores it is asked for."""
import importlib
import os
import time
from pathlib import Path

import pytest

from common.utils.config import layer_configs, packaged_config
from tests.scripts import load_script

CONFIGS = {"graphattn.train": ("graphattn", "gat.yaml"), "tagging.train": ("tagging", "tagging.yaml"),
           "nlu.train": ("nlu", "glue.yaml")}


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/busy_cpu.py")


@pytest.mark.parametrize("name", ["gat", "tagging", "nlu"])
def test_each_command_parses_with_its_cli_and_its_keys_exist(bench, name, tmp_path):
    module, *args = [a.replace("{out}", str(tmp_path / "run")) for a in bench.COMMANDS[name]]
    cli = importlib.import_module(module)
    parsed = cli.parse_args([*args, "--no-progress"])
    overrides = [a for a in args if "=" in a and not a.startswith("-")]
    package, defaults = CONFIGS[module]
    layer_configs(packaged_config(package, defaults), None, overrides)  # an unknown key would raise
    assert parsed.out == str(tmp_path / "run") and parsed.no_progress


def test_env_pairs_are_parsed_and_a_malformed_one_is_refused(bench):
    assert bench.parse_env(["OMP_WAIT_POLICY=PASSIVE", "GOMP_SPINCOUNT=0"]) == {
        "OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "0"}
    with pytest.raises(SystemExit, match="--env PASSIVE: write NAME=VALUE"):
        bench.parse_env(["PASSIVE"])


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (Linux ``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_spinner_keeps_a_core_busy_until_terminated(bench):
    import multiprocessing

    process = multiprocessing.Process(target=bench.spin, daemon=True)
    process.start()
    try:
        before, start = cpu_seconds(process.pid), time.perf_counter()
        time.sleep(1.0)
        busy = (cpu_seconds(process.pid) - before) / (time.perf_counter() - start)
        assert busy > 0.3  # a core's share even on a loaded machine; an idle process stays near 0
    finally:
        process.terminate()
        process.join()
    assert not process.is_alive()

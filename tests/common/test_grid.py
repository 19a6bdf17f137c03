"""common.utils.grid.run_cells: cells a few at a time, failures reported, and a stop that interrupts running cells
as a Ctrl-C does (they save and exit 130) and starts no more."""
import argparse
import signal
import sys
import time

import pytest

from common.utils.grid import Cell, add_grid_options, check_grid_options, run_cells, stop_seconds

#: A trainer's Ctrl-C in miniature: runs until SIGINT, then writes "saved" and exits 130.
_INTERRUPTIBLE = ("import sys, time, pathlib\n"
                  "try:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n"
                  "    pathlib.Path(sys.argv[1]).write_text('saved'); sys.exit(130)\n")


def _cell(tmp_path, name, code, *args):
    return Cell(name, [sys.executable, "-c", code, *map(str, args)], tmp_path / name)


def test_cells_run_and_failures_are_returned(tmp_path, capsys):
    cells = [_cell(tmp_path, "ok", "print('fine')"), _cell(tmp_path, "bad", "import sys; sys.exit(3)")]
    assert run_cells(cells, jobs=2) == ["bad"]
    assert (tmp_path / "ok" / "train.log").read_text() == "fine\n"
    assert "bad: FAILED (exit 3" in capsys.readouterr().out


def test_stop_after_interrupts_the_running_cells_and_starts_no_more(tmp_path, capsys):
    cells = [_cell(tmp_path, "long", _INTERRUPTIBLE, tmp_path / "marker"), _cell(tmp_path, "later", "print('ran')")]
    began = time.time()
    ignored = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as in a grid started with `nohup ... &`
    try:
        assert run_cells(cells, jobs=1, stop_after=3) == []  # interrupted is not failed
    finally:
        signal.signal(signal.SIGINT, ignored)
    assert time.time() - began < 30
    assert (tmp_path / "marker").read_text() == "saved"
    out = capsys.readouterr().out
    assert "long: interrupted (a rerun resumes it)" in out and "1 not started" in out
    assert not (tmp_path / "later").exists()


def test_grid_options_parse_and_refuse_what_cannot_run():
    parser = argparse.ArgumentParser()
    add_grid_options(parser)
    args = parser.parse_args(["--jobs", "3", "--stop-after", "1.5"])
    check_grid_options(parser, args)
    assert (args.jobs, stop_seconds(args), stop_seconds(parser.parse_args([]))) == (3, 90.0, None)
    for bad in (["--jobs", "0"], ["--stop-after", "0"]):
        with pytest.raises(SystemExit):
            check_grid_options(parser, parser.parse_args(bad))

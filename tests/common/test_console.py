"""The shared console: log lines instead of bars off a terminal, the closing block, Ctrl-C."""
import os
import signal

from common.utils import console


def test_progress_off_a_terminal_logs_one_line_per_interval_with_an_eta(monkeypatch, capsys):
    monkeypatch.setenv(console.PROGRESS_SECONDS_ENV, "0")
    bar = console.progress(total=4, desc="seed 0 epoch", unit="epoch")
    bar.set_postfix(val_acc="0.500")
    bar.update()
    bar.set_total(10)  # an early-stopping budget that grew
    bar.update()
    bar.close()
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("seed 0 epoch 1/4 | 25% |") and lines[0].endswith("val_acc 0.500")
    assert lines[1].startswith("seed 0 epoch 2/10 | 20% |") and "ETA" in lines[1]
    assert "\r" not in "".join(lines)


def test_progress_is_quiet_between_intervals_and_when_disabled(monkeypatch, capsys):
    monkeypatch.setenv(console.PROGRESS_SECONDS_ENV, "3600")
    assert list(console.progress(range(3), desc="x")) == [0, 1, 2]
    assert list(console.progress(range(3), desc="y", enabled=False)) == [0, 1, 2]
    assert capsys.readouterr().err == ""


def test_bad_interval_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(console.PROGRESS_SECONDS_ENV, "soon")
    try:
        console.log_interval()
    except ValueError as err:
        assert "ATTN_PROGRESS_SECONDS='soon'" in str(err)
    else:
        raise AssertionError("no error")


def test_files_written_lists_existing_files_only(tmp_path, capsys):
    (tmp_path / "results.json").write_text("{}")
    (tmp_path / "curves").mkdir()
    console.files_written([tmp_path / "results.json", tmp_path / "missing.png", tmp_path / "curves"])
    out = capsys.readouterr().out.splitlines()
    assert out == ["files written:", f"  {tmp_path / 'results.json'}", f"  {tmp_path / 'curves'}/"]


def test_ctrl_c_names_the_live_loops_and_exits_130(monkeypatch, capsys):
    monkeypatch.setenv(console.PROGRESS_SECONDS_ENV, "3600")

    @console.interruptible
    def main():
        for seed in console.progress(range(3), desc="seeds"):
            for epoch in console.progress(range(100), desc=f"seed {seed} epoch"):
                if seed == 1 and epoch == 5:
                    os.kill(os.getpid(), signal.SIGINT)
        return 0

    before = signal.getsignal(signal.SIGINT)
    assert main() == console.INTERRUPTED == 130
    err = capsys.readouterr().err
    assert err.strip() == "interrupted at seeds 1/3, seed 1 epoch 5/100; re-run the same command to resume"
    assert signal.getsignal(signal.SIGINT) is before and not console._live

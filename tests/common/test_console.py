"""The shared console: log lines instead of bars off a terminal, the closing block, Ctrl-C."""
import os
import signal

from common.utils import console


class Clock:
    """A stand-in for the ``time`` module whose ``perf_counter`` moves only when told."""

    def __init__(self):
        self.now = 1000.0

    def perf_counter(self):
        return self.now


def test_progress_off_a_terminal_logs_one_line_per_interval_with_a_steady_eta(monkeypatch, capsys):
    monkeypatch.setenv(console.PROGRESS_SECONDS_ENV, "0")
    monkeypatch.setattr(console, "time", clock := Clock())
    bar = console.progress(total=4, desc="Cora softmax seeds", unit="seed")
    clock.now += 2
    bar.skip()  # a seed reused from an earlier run: no part of the rate
    clock.now += 10
    bar.update()
    clock.now += 5
    halfway = bar.line()  # read in the middle of a step: the ETA has not moved
    clock.now += 25
    bar.set_postfix(best="0.900")
    bar.update()
    bar.close()
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["Cora softmax seeds 1/4 | 25% | 00:02 elapsed",
                     "Cora softmax seeds 2/4 | 50% | 00:12 elapsed | ETA 00:20",
                     "Cora softmax seeds 3/4 | 75% | 00:42 elapsed | ETA 00:20 | best 0.900"]
    assert halfway == "Cora softmax seeds 2/4 | 50% | 00:17 elapsed | ETA 00:20"


def test_a_loop_without_a_known_end_shows_its_bound_and_never_a_percentage(monkeypatch, capsys):
    monkeypatch.setenv(console.PROGRESS_SECONDS_ENV, "0")
    monkeypatch.setattr(console, "time", clock := Clock())
    bar = console.progress(desc="seed 0 epoch", unit="epoch", bound=1000)
    for left in (100, 99):
        clock.now += 2
        bar.set_postfix(val_acc="0.550", patience_left=f"{left}/100")
        bar.update()
    assert console.where() == "seed 0 epoch 2 of at most 1000"
    bar.close()
    assert capsys.readouterr().err.splitlines() == [
        "seed 0 epoch 1 of at most 1000 | 00:02 elapsed | 2.00 s/epoch | val_acc 0.550, patience_left 100/100",
        "seed 0 epoch 2 of at most 1000 | 00:04 elapsed | 2.00 s/epoch | val_acc 0.550, patience_left 99/100"]


def test_terminal_bars_show_the_bound_and_the_steady_eta(monkeypatch):
    monkeypatch.setattr(console, "interactive", lambda: True)
    monkeypatch.setattr(console, "time", clock := Clock())
    open_ended = console.progress(desc="seed 0 epoch", unit="epoch", bound=1000)
    open_ended.update()
    text = str(open_ended._bar)
    assert text.startswith("seed 0 epoch 1 of at most 1000 [") and "%" not in text
    seeds = console.progress(total=4, desc="seeds", unit="seed")
    seeds.skip()
    clock.now += 10
    seeds.update()  # one seed trained in 10 s, one reused: 2 left take 20 s, whatever tqdm's own clock says
    assert "<00:20" in str(seeds._bar) and "10.00s/seed" in str(seeds._bar)
    for bar in (open_ended, seeds):
        bar.close()


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


def test_a_smoothed_eta_moves_by_the_evidence_of_each_uneven_seed(monkeypatch, capsys):
    """Seeds of 88, 260 and 203 s out of 10 (the issue's walkthrough): the mean alone gives 13:12, 23:12, 21:26;
    the finish times predicted at each seed, weighted 1, 2, 3 by the seeds they rest on, give 13:12, 18:25, 18:14."""
    monkeypatch.setenv(console.PROGRESS_SECONDS_ENV, "0")
    monkeypatch.setattr(console, "time", clock := Clock())
    plain = console.progress(total=10, desc="mean", unit="seed")
    smooth = console.progress(total=10, desc="smoothed", unit="seed", smooth_eta=True)
    for seconds in (88, 260, 203):
        clock.now += seconds
        plain.update()
        smooth.update()
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" | ")[-1] for line in lines] == ["ETA 13:12", "ETA 13:12", "ETA 23:12", "ETA 18:25",
                                                         "ETA 21:26", "ETA 18:14"]
    clock.now += 100  # read in the middle of a step: neither ETA moves
    assert [bar.line().split(" | ")[-1] for bar in (plain, smooth)] == ["ETA 21:26", "ETA 18:14"]
    for seconds in (30, 20, 20, 20, 20, 20, 20):  # fast last seeds: the smoothed finish still lies ahead
        clock.now += seconds
        plain.update()
        smooth.update()
    assert smooth._finish / smooth._evidence > clock.now  # ... but a finished loop has nothing left
    assert [bar.line().split(" | ")[-1] for bar in (plain, smooth)] == ["ETA 00:00", "ETA 00:00"]
    for bar in (plain, smooth):
        bar.close()


def test_a_loop_moves_its_bound_where_its_patience_runs_out(monkeypatch, capsys):
    monkeypatch.setenv(console.PROGRESS_SECONDS_ENV, "0")
    monkeypatch.setattr(console, "time", clock := Clock())
    bar = console.progress(desc="seed 0 epoch", unit="epoch", bound=100)
    for bound in (101, 101, 103):
        clock.now += 1
        bar.set_bound(bound)
        bar.update()
    assert console.where() == "seed 0 epoch 3 of at most 103"
    bar.close()
    assert [line.split(" | ")[0] for line in capsys.readouterr().err.splitlines()] == [
        "seed 0 epoch 1 of at most 101", "seed 0 epoch 2 of at most 101", "seed 0 epoch 3 of at most 103"]


def test_terminal_bars_show_the_smoothed_eta_and_the_moved_bound(monkeypatch):
    monkeypatch.setattr(console, "interactive", lambda: True)
    monkeypatch.setattr(console, "time", clock := Clock())
    seeds = console.progress(total=10, desc="seeds", unit="seed", smooth_eta=True)
    for seconds in (88, 260):
        clock.now += seconds
        seeds.update()
    assert "<18:25" in str(seeds._bar)
    epochs = console.progress(desc="seed 2 epoch", unit="epoch", bound=100)
    epochs.set_bound(57)
    assert str(epochs._bar).startswith("seed 2 epoch 0 of at most 57 [")
    for bar in (seeds, epochs):
        bar.close()


def test_a_failing_command_ends_with_one_error_line_and_its_status(capsys):
    assert console.fail(FileNotFoundError("data/x.tsv is missing: put it back")) == 2
    assert console.fail("no pretrained model", 1) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == "error: data/x.tsv is missing: put it back\nerror: no pretrained model\n"

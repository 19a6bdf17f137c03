"""common.utils.runs: what an evaluate CLI says of the seeds it scores (finished or not, which checkpoint)."""
from pathlib import Path

from common.utils.runs import ScoredSeed, planned_seeds, unfinished_note, unfinished_seeds


def test_a_seed_is_finished_where_its_record_exists(tmp_path):
    (tmp_path / "seed0.json").write_text("{}")
    done = ScoredSeed.of(0, tmp_path / "seed0" / "best.pt", tmp_path / "seed0.json")
    stopped = ScoredSeed.of(1, tmp_path / "seed1" / "best.pt", tmp_path / "seed1.json")
    assert done.finished and not stopped.finished
    assert stopped.record() == {"seed": 1, "checkpoint": str(tmp_path / "seed1" / "best.pt"), "finished": False}
    assert done.line() == f"seed 0: checkpoint {tmp_path / 'seed0' / 'best.pt'}"
    assert stopped.line() == (f"seed 1: checkpoint {tmp_path / 'seed1' / 'best.pt'} "
                              f"(training unfinished: the weights saved so far)")


def test_an_average_of_checkpoints_is_named_whole_and_read_back():
    averaged = ScoredSeed(1, (Path("run/checkpoints/step_4.pt"), Path("run/checkpoints/step_6.pt")), False)
    assert averaged.record()["checkpoint"] == ["run/checkpoints/step_4.pt", "run/checkpoints/step_6.pt"]
    assert averaged.line().startswith("seed 1: checkpoint the average of run/checkpoints/step_4.pt, "
                                      "run/checkpoints/step_6.pt (training unfinished")
    assert ScoredSeed.from_record(averaged.record()) == averaged
    one = ScoredSeed(0, Path("run/best.pt"), True)
    assert ScoredSeed.from_record({**one.record(), "scores": {}}) == one


def test_planned_seeds_of_several_seed_and_one_seed_configs():
    assert planned_seeds({"seeds": 3, "first_seed": 2}) == [2, 3, 4]
    assert planned_seeds({"seed": 1}) == [1]


def test_the_note_names_seeds_scored_unfinished_and_seeds_without_a_checkpoint():
    scored = [ScoredSeed(0, Path("a"), True), ScoredSeed(1, Path("b"), False)]
    assert unfinished_seeds(scored, [0, 1, 2, 3]) == [1, 2, 3]
    assert unfinished_note(scored, [0, 1, 2, 3], "python -m tagging.train") == (
        "unfinished: seed 1 scored at the weights saved so far; seeds 2, 3 not scored (no checkpoint); "
        "re-run the run's python -m tagging.train command to finish its training")
    assert unfinished_note(scored[:1], [0], "python -m tagging.train") is None
    assert unfinished_seeds(scored[:1]) == []

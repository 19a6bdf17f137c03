"""What every evaluate CLI says of a one-seed run scored before its training finished (issue 40 item 5)."""
import json
from pathlib import Path


def assert_reported_unfinished(captured, report: Path, seed: int, checkpoint: Path, train_cli: str) -> dict:
    """The checkpoint line on stderr, the note on stdout naming ``train_cli``, and the seed's keys in the evaluation
    JSON ``report`` (returned)."""
    assert f"seed {seed}: checkpoint {checkpoint} (training unfinished: the weights saved so far)" in \
        captured.err.splitlines()
    assert (f"unfinished: seed {seed} scored at the weights saved so far; re-run the run's {train_cli} "
            "command to finish its training") in captured.out.splitlines()
    record = json.loads(Path(report).read_text())
    assert (record["seed"], record["checkpoint"], record["finished"]) == (seed, str(checkpoint), False)
    assert record["unfinished_seeds"] == [seed]
    return record

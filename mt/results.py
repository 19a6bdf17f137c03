"""The end of a translation run: the selected (or checkpoint-averaged) model scored with beam search on the
validation and test splits, ``results.json``, ``curves.png``, and the closing lines on stdout."""
from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from common.training import TrainState
from common.utils import atomic_write_json, console, read_metrics, results_record
from common.utils.runtime import Runtime

from .config import to_dict
from .data import Prepared
from .run import RunFiles, load_model
from .text import write_lines
from .translation import bleu_on_split

#: How the summary line and the plot title name the corpora of :data:`mt.data.CORPORA`.
CORPUS_TITLES = {"multi30k": "Multi30k de-en", "iwslt14": "IWSLT'14 de-en", "demo": "a toy de-en corpus"}


def run_title(cfg) -> str:
    """The preset and the corpus of a run's config, e.g. ``transformer-cpu on IWSLT'14 de-en``."""
    return f"{cfg['preset']} on {CORPUS_TITLES.get(cfg['dataset'], cfg['dataset'])}"


def epochs(state: TrainState) -> int:
    """The 1-based epoch of the latest update, as the progress counts (0 before the first)."""
    return state.epoch + (1 if state.batch else 0)


def finish(cfg: DictConfig, out_dir: Path, prepared: Prepared, state: TrainState, runtime: Runtime) -> dict:
    """Score the selected (or averaged) model on the validation and test splits; write results."""
    average = cfg.train.average_last if cfg.train.average_last > 1 else None
    model = load_model(RunFiles(out_dir), average_last=average).to(runtime.device)
    e = cfg.eval
    splits = {}
    for split in [cfg.data.valid_split, *cfg.data.test_splits]:
        result = bleu_on_split(model, prepared, split, e.beam, e.length_penalty, e.max_len_a, e.max_len_b,
                               e.batch_sentences, progress=cfg.train.progress, runtime=runtime)
        write_lines(out_dir / f"{split}.hyp.txt", result.pop("hypotheses"))
        splits[split] = result
        console.say(f"{split}: BLEU {result['bleu']:.2f} (tokenised, lowercased) | "
                    f"SacreBLEU {result['sacrebleu']:.2f}")
    from .plots import plot_curves  # matplotlib, only once there is something to plot

    curves = plot_curves(read_metrics(out_dir / "metrics.jsonl"), out_dir / "curves.png", title=run_title(cfg))
    record = results_record(to_dict(cfg), splits=splits, best_step=state.best_step, updates=state.step,
                            epochs=epochs(state), complete_epochs=state.epoch, train_seconds=state.train_seconds,
                            model=average and f"average of last {average} checkpoints" or "best.pt",
                            curves=curves.name, parameters=sum(t.numel() for t in model.parameters()),
                            runtime=runtime.describe())
    atomic_write_json(out_dir / "results.json", record)
    return record


def summarize(record: dict, out_dir: Path) -> None:
    """The closing lines on stdout: BLEU per test split, where training stopped, the files written."""
    cfg = record["config"]
    tests = ", ".join(f"{split} BLEU {record['splits'][split]['bleu']:.2f}" for split in cfg["data"]["test_splits"])
    print(f"{run_title(cfg)}: {tests} ({record['model']}, update {record['best_step']}); "
          f"{record['updates']} updates in {record['epochs']} epoch(s), {record['train_seconds']:.0f} s of training")
    splits = [cfg["data"]["valid_split"], *cfg["data"]["test_splits"]]
    console.files_written([out_dir / name for name in ("results.json", record["curves"], "best.pt", "checkpoints",
                                                        "metrics.jsonl", "config.json")]
                          + [out_dir / f"{split}.hyp.txt" for split in splits])

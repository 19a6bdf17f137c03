"""The inputs of an Att2in training run (:mod:`captioning.training`): every missing input file named at once, and
the synthetic inputs of ``--demo``."""
from __future__ import annotations

from omegaconf import DictConfig

from common.utils.paths import check_inputs

from .config import data_path, prepared_dir
from .prepare import KARPATHY_FIX, default_dataset_json


def check_run_inputs(cfg: DictConfig) -> None:
    """One error naming every missing input: the region features and, while the captions are not
    prepared, Karpathy's file that ``captioning.prepare`` needs (not the file that it would write)."""
    prepared = prepared_dir(cfg)
    prepare = " ".join(["python -m captioning.prepare", *(["--data-root", cfg.data_root] if cfg.data_root else []),
                        *(["--out", str(prepared)] if cfg.data.prepared else [])])
    karpathy = None if (prepared / "captions.json").is_file() else default_dataset_json(cfg.data_root)
    check_inputs([("read by captioning.prepare", karpathy, f"{KARPATHY_FIX}, then run `{prepare}`"),
                  ("data.features", data_path(cfg, cfg.data.features),
                   "create it with scripts/convert_features.py or scripts/extract_features.py")])


def write_demo_data(cfg: DictConfig) -> None:
    """``--demo``'s inputs: the synthetic COCO of :mod:`captioning.fixtures` (with COCO image 273052's
    boxes, for ``captioning.visualize``) in ``cfg.data_root``, its captions prepared in ``data.prepared``."""
    from .fixtures import write_karpathy_fixture
    from .prepare import prepare

    paths = write_karpathy_fixture(cfg.data_root, include_demo_image=True)
    prepare(paths["dataset"], prepared_dir(cfg))

"""The training engine every domain trains with (:mod:`.engine`) and the seed loop of multi-seed runs
(:mod:`.seeds`). Each name imports its submodule on first use (:mod:`common.lazy`)."""
from common.lazy import lazy_exports

_EXPORTS = {"Engine": "engine", "Plan": "engine", "Task": "engine", "TrainState": "engine",
            "train_seeds": "seeds", "seeds_record": "seeds", "seed_run_files": "seeds",
            "EpochBatches": "batches"}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

import pytest

from captioning.fixtures import write_karpathy_fixture
from captioning.prepare import prepare


@pytest.fixture(scope="session")
def coco_fixture(tmp_path_factory) -> dict:
    """20 train + 5 val + 5 test images (made-up ids), prepared into ``<root>/coco/prepared``."""
    root = tmp_path_factory.mktemp("coco-fixture")
    paths = write_karpathy_fixture(root)
    prepare(paths["dataset"], root / "coco" / "prepared")
    return {"root": root, "prepared": root / "coco" / "prepared", **paths}


@pytest.fixture
def tiny_overrides():
    """Config overrides of a small, dropout-free Att2in that memorises the fixture in seconds."""
    return lambda root, out: [f"data_root={root}", "data.prepared=coco/prepared", f"out_dir={out}", "model.embed_dim=64", "model.rnn_size=64",
            "model.att_hidden=64", "model.dropout=0.0", "optim.lr=5e-3", "optim.decay_start=-1",
            "scheduled_sampling.start=-1", "train.batch_size=5", "train.num_workers=0", "train.num_threads=1"]

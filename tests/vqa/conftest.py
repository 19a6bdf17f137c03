"""A VQA fixture shared by the MCAN tests; every vqa test runs on one thread."""
import pytest
import torch

from vqa.fixtures import write_vqa_fixture


@pytest.fixture(scope="session")
def vqa_fixture(tmp_path_factory):
    """10 images x 5 questions per split (train2014, val2014), 16-d features, 4-12 regions."""
    return write_vqa_fixture(tmp_path_factory.mktemp("vqa_fixture"), num_images=10, questions_per_image=5,
                             feature_dim=16, num_regions=(4, 12))


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run fastest on one thread on a shared CPU (no OpenMP contention)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

"""A VQA fixture shared by the MCAN tests; every vqa test runs on one thread."""
import pytest

from vqa.fixtures import write_vqa_fixture


@pytest.fixture(scope="session")
def vqa_fixture(tmp_path_factory):
    """10 images x 5 questions per split (train2014, val2014), 16-d features, 4-12 regions."""
    return write_vqa_fixture(tmp_path_factory.mktemp("vqa_fixture"), num_images=10, questions_per_image=5,
                             feature_dim=16, num_regions=(4, 12))


@pytest.fixture(autouse=True)
def _single_thread(one_thread):
    """Every vqa test runs on one thread (``one_thread`` in tests/conftest.py)."""

"""The CUDA tests reuse the domains' fixtures; every test here is marked ``cuda`` and skipped without
CUDA (tests/conftest.py)."""
from ..captioning.conftest import coco_fixture, tiny_overrides  # noqa: F401
from ..mt.conftest import tiny_root  # noqa: F401
from ..vqa.conftest import vqa_fixture  # noqa: F401
from ..vqa.lxmert.conftest import vqa_root  # noqa: F401

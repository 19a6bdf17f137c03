import pytest


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """Processed datasets go to a throwaway cache, not the user's."""
    patch = pytest.MonkeyPatch()
    patch.setenv("ATTN_CACHE_DIR", str(tmp_path_factory.mktemp("attn-cache")))
    yield
    patch.undo()


import pytest


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    """An empty icl-ssm cache dir (``$ICL_SSM_CACHE``) private to the test."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("ICL_SSM_CACHE", str(cache))
    return cache

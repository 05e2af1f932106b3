"""Where the C-MAPSS files come from, in order of precedence:

1. an explicit directory (`--data-dir` flag or `data_dir` config key),
2. the `CMAPSS_DIR` environment variable,
3. the download cache (`data/cmapss/`, or `$RUL_CACHE_DIR`),
4. a download of the official archive, checksum-verified, into that cache.

An explicit or environment directory is used as given (no silent fallback to other data). A
download is verified (the archive's published MD5, each extracted file's SHA-256 below) and
only complete, verified files are moved into the cache: a failed one leaves nothing behind.
"""

import hashlib
import os
import shutil
import tempfile
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from rul.data.errors import DataUnavailableError
from rul.data.schema import SUBSETS, check_subset, file_names

ENV_VAR = "CMAPSS_DIR"
CACHE_ENV_VAR = "RUL_CACHE_DIR"
DEFAULT_CACHE = Path("data") / "cmapss"


@dataclass(frozen=True)
class Archive:
    """A downloadable C-MAPSS archive and the sums its contents must match."""

    urls: tuple[str, ...]
    md5: str | None
    # SHA-256 of extracted files, by file name. A file without an entry is covered by the
    # archive's MD5 only; add its sum here once it has been checked against NASA's release.
    sha256: dict[str, str] = field(default_factory=dict)


# NASA's C-MAPSS release as mirrored on Zenodo (record 15346912, the copy NASA's progpy uses).
OFFICIAL_ARCHIVE = Archive(
    urls=("https://zenodo.org/records/15346912/files/CMAPSSData.zip?download=1",),
    md5="79a22f36e80606c69d0e9e4da5bb2b7a",
    sha256={
        "train_FD001.txt": "963b5e22825b34d8b21c69e1aeb4af3e647050eb672ee8834ba4b5d91d2de0f8",
        "test_FD001.txt": "3cda7109ce17bafb5443f2ac926cfcf88154b941b8c4cf95eb55d1ddd6f52851",
        "RUL_FD001.txt": "a19c8ec94931949d0485bdc35118206e9c81c4547b422efb9cf86f4ceddbceca",
        "readme.txt": "f8af5e147bc1525af80c47d41d2a9faa95ebda3d3a5c7d05fc1a0e506449c2de",
    },
)


def sha256_of(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV_VAR) or DEFAULT_CACHE)


def locate(subset: str, data_dir: str | Path | None = None, *, download: bool = True,
           archive: Archive = OFFICIAL_ARCHIVE) -> Path:
    """Return the directory holding the three files of `subset`, downloading if needed."""
    subset = check_subset(subset)
    names = file_names(subset).values()
    for origin, given in (("data_dir", data_dir), (ENV_VAR, os.environ.get(ENV_VAR))):
        if given:
            directory = Path(given).expanduser()
            missing = [n for n in names if not (directory / n).is_file()]
            if missing:
                raise DataUnavailableError(
                    f"{origin} points at {directory}, which lacks {', '.join(missing)}"
                )
            return directory
    cache = cache_dir()
    if all((cache / n).is_file() for n in names):
        return cache
    if not download:
        raise DataUnavailableError(_how_to_supply(subset, "downloads are disabled"))
    download_archive(cache, archive)
    missing = [n for n in names if not (cache / n).is_file()]
    if missing:
        raise DataUnavailableError(f"the downloaded archive lacks {', '.join(missing)}")
    return cache


def cmapss_file(name: str, data_dir: str | Path | None = None, *,
                download: bool = True) -> Path:
    """Where rul reads C-MAPSS file `name` (e.g. "test_FD001.txt"): the absolute path in the
    folder `locate` finds for its subset (`data_dir`, `CMAPSS_DIR`, the cache, or a download
    into the cache), the one `rul train` reads. Documented snippets ask it rather than
    restating a path; `rul cmapss-file NAME` prints it."""
    subset = next((s for s in SUBSETS if name in file_names(s).values()), None)
    if subset is None:
        raise DataUnavailableError(
            f"{name!r} is not a C-MAPSS file: expected train_FDxxx.txt, test_FDxxx.txt or "
            f"RUL_FDxxx.txt for FDxxx one of {', '.join(SUBSETS)}")
    return (locate(subset, data_dir, download=download) / name).absolute()


def download_archive(destination: str | Path, archive: Archive = OFFICIAL_ARCHIVE) -> list[Path]:
    """Download, verify and extract the C-MAPSS data files into `destination`, in a temporary
    directory beside it: on any failure nothing new is left there."""
    destination = Path(destination)
    missing = [p for p in (destination, *destination.parents) if not p.exists()]
    destination.mkdir(parents=True, exist_ok=True)
    try:
        return _download_into(destination, archive)
    except BaseException:
        if missing:  # the outermost folder this made (data/ of data/cmapss), and what's in it
            shutil.rmtree(missing[-1], ignore_errors=True)
        raise


def _download_into(destination: Path, archive: Archive) -> list[Path]:
    errors = []
    with tempfile.TemporaryDirectory(prefix=".download-", dir=destination) as scratch:
        scratch = Path(scratch)
        for url in archive.urls:
            try:
                zip_path = _fetch(url, scratch / "archive.zip")
                break
            except (urllib.error.URLError, OSError, TimeoutError) as error:
                errors.append(f"{url}: {error}")
        else:
            raise DataUnavailableError(_how_to_supply("FD001..FD004", "; ".join(errors)))
        if archive.md5 and (actual := _md5_of(zip_path)) != archive.md5:
            raise DataUnavailableError(
                f"downloaded archive is corrupt: MD5 {actual}, expected {archive.md5}"
            )
        extracted = _extract_data_files(zip_path, scratch / "files")
        for name, path in extracted.items():
            expected = archive.sha256.get(name)
            if expected and (actual := sha256_of(path)) != expected:
                raise DataUnavailableError(
                    f"{name} from the downloaded archive is corrupt: SHA-256 {actual}, "
                    f"expected {expected}"
                )
        placed = []
        for name, path in extracted.items():
            os.replace(path, destination / name)
            placed.append(destination / name)
    return placed


def _fetch(url: str, target: Path) -> Path:
    partial = target.with_suffix(".part")
    with urllib.request.urlopen(url, timeout=60) as response, open(partial, "wb") as out:
        total = int(response.headers.get("Content-Length") or 0) or None
        with tqdm(total=total, unit="B", unit_scale=True, desc="C-MAPSS download") as bar:
            for chunk in iter(lambda: response.read(1 << 16), b""):
                out.write(chunk)
                bar.update(len(chunk))
    if total is not None and partial.stat().st_size != total:
        raise OSError(f"incomplete download: {partial.stat().st_size} of {total} bytes")
    os.replace(partial, target)
    return target


def _md5_of(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _extract_data_files(zip_path: Path, target: Path) -> dict[str, Path]:
    """Extract the data files (wherever they sit in the archive) flat into `target`."""
    wanted = {n for s in SUBSETS for n in file_names(s).values()} | {"readme.txt"}
    target.mkdir()
    found = {}
    try:
        with zipfile.ZipFile(zip_path) as bundle:
            for member in bundle.infolist():
                name = Path(member.filename).name
                if name in wanted and not member.is_dir():
                    with bundle.open(member) as source, open(target / name, "wb") as out:
                        shutil.copyfileobj(source, out)
                    found[name] = target / name
    except zipfile.BadZipFile as error:
        raise DataUnavailableError(f"downloaded archive is not a valid zip: {error}") from None
    if not any(n.startswith("train_") for n in found):
        raise DataUnavailableError("downloaded archive holds no C-MAPSS train_FDxxx.txt files")
    return found


def _how_to_supply(subset: str, reason: str) -> str:
    return (
        f"C-MAPSS {subset} is not available locally and could not be downloaded ({reason}).\n"
        "Supply a local copy: put train_FDxxx.txt, test_FDxxx.txt and RUL_FDxxx.txt in a "
        "folder, then either\n"
        f"  export {ENV_VAR}=/path/to/folder\n"
        "  or pass --data-dir /path/to/folder (config key data_dir),\n"
        f"  or copy the files into {cache_dir()}/."
    )

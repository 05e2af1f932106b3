"""Where the data comes from: explicit folder > $CMAPSS_DIR > cache > verified download.

Downloads go to a real HTTP server on 127.0.0.1 that serves zips built in the test.
"""

import hashlib
import http.server
import io
import socket
import threading
import zipfile
from pathlib import Path

import pytest

from rul.data import DataUnavailableError
from rul.data.sources import (
    CACHE_ENV_VAR,
    ENV_VAR,
    OFFICIAL_ARCHIVE,
    Archive,
    download_archive,
    locate,
    sha256_of,
)

FD001_FILES = ("train_FD001.txt", "test_FD001.txt", "RUL_FD001.txt")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch, tmp_path):
    """No data folder from the environment, a private cache, and no proxy for 127.0.0.1."""
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setenv(CACHE_ENV_VAR, str(tmp_path / "cache"))
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy",
                 "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


class Server:
    """Serves `files` (URL path -> bytes) and records the paths requested."""

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.requests: list[str] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's naming)
                server.requests.append(self.path)
                body = server.files.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/zip")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def serve(self, path: str, body: bytes) -> str:
        self.files[path] = body
        return self.url(path)


@pytest.fixture
def server():
    srv = Server()
    srv.thread.start()
    yield srv
    srv.httpd.shutdown()
    srv.httpd.server_close()
    srv.thread.join(timeout=5)


@pytest.fixture
def closed_port_url() -> str:
    """A URL on 127.0.0.1 where nothing listens (connection refused)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/CMAPSSData.zip"


@pytest.fixture
def source_files(write_cmapss, tmp_path) -> dict[str, bytes]:
    """Contents of a small synthetic FD001 plus a readme, by file name."""
    directory = write_cmapss(tmp_path / "source")
    (directory / "readme.txt").write_text("Synthetic C-MAPSS for tests.\n")
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


def make_zip(files: dict[str, bytes], folder: str = "CMAPSSData/", extra=True) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as bundle:
        if folder:
            bundle.writestr(folder, b"")  # an explicit directory entry, as zip tools write
        for name, body in files.items():
            bundle.writestr(folder + name, body)
        if extra:  # not a data file: must not be extracted
            bundle.writestr(folder + "Damage Propagation Modeling.pdf", b"%PDF-1.4 fake")
            bundle.writestr("__MACOSX/" + folder + "._train_FD001.txt", b"junk")
    return buffer.getvalue()


def md5(body: bytes) -> str:
    return hashlib.md5(body, usedforsecurity=False).hexdigest()


def sha256(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def archive_for(url_or_urls, zip_bytes: bytes, files: dict[str, bytes], **overrides) -> Archive:
    urls = (url_or_urls,) if isinstance(url_or_urls, str) else tuple(url_or_urls)
    fields = {"urls": urls, "md5": md5(zip_bytes),
              "sha256": {name: sha256(body) for name, body in files.items()}}
    fields.update(overrides)
    return Archive(**fields)


def listing(directory: Path) -> list[str]:
    """Everything under `directory`, relative; [] when it does not exist."""
    if not directory.exists():
        return []
    return sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*"))


def write_fd001(directory: Path, tag: str) -> Path:
    """Minimal stand-in files (locate only checks presence); content names the folder."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in FD001_FILES:
        (directory / name).write_text(f"{tag} {name}\n")
    return directory


# --- precedence --------------------------------------------------------------------------------


def test_explicit_dir_wins_over_env_and_cache(tmp_path, monkeypatch, closed_port_url):
    explicit = write_fd001(tmp_path / "explicit", "explicit")
    env = write_fd001(tmp_path / "env", "env")
    write_fd001(tmp_path / "cache", "cache")
    monkeypatch.setenv(ENV_VAR, str(env))
    archive = Archive(urls=(closed_port_url,), md5=None)

    assert locate("FD001", explicit, archive=archive) == explicit
    assert locate("FD001", str(explicit), archive=archive) == explicit


def test_env_dir_wins_over_cache(tmp_path, monkeypatch, closed_port_url):
    env = write_fd001(tmp_path / "env", "env")
    write_fd001(tmp_path / "cache", "cache")
    monkeypatch.setenv(ENV_VAR, str(env))
    assert locate("FD001", archive=Archive(urls=(closed_port_url,), md5=None)) == env


def test_cache_is_used_without_downloading(tmp_path, server, source_files):
    cache = write_fd001(tmp_path / "cache", "cache")
    body = make_zip(source_files)
    archive = archive_for(server.serve("/CMAPSSData.zip", body), body, source_files)

    assert locate("FD001", archive=archive) == cache
    assert server.requests == []
    assert (cache / "train_FD001.txt").read_text() == "cache train_FD001.txt\n"


def test_download_when_nothing_is_local(tmp_path, server, source_files):
    body = make_zip(source_files)
    archive = archive_for(server.serve("/CMAPSSData.zip", body), body, source_files)

    found = locate("fd001", archive=archive)

    cache = tmp_path / "cache"
    assert found == cache
    assert server.requests == ["/CMAPSSData.zip"]
    assert listing(cache) == sorted(source_files)
    for name, content in source_files.items():
        assert (cache / name).read_bytes() == content
    # a second call finds the cache and does not download again
    assert locate("FD001", archive=archive) == cache
    assert server.requests == ["/CMAPSSData.zip"]


def test_cache_dir_defaults_to_data_cmapss(tmp_path, monkeypatch):
    from rul.data.sources import cache_dir

    monkeypatch.delenv(CACHE_ENV_VAR)
    assert cache_dir() == Path("data") / "cmapss"
    monkeypatch.setenv(CACHE_ENV_VAR, str(tmp_path / "elsewhere"))
    assert cache_dir() == tmp_path / "elsewhere"


def test_the_user_cache_does_not_move_the_data(tmp_path, monkeypatch):
    """rul's user cache (precision figures, ONNX graphs: never needed) has a variable of its
    own: pointing it elsewhere, as the test suite does, leaves the data where it is."""
    from rul.data.sources import cache_dir
    from rul.files import USER_CACHE_ENV, cache_folder

    monkeypatch.delenv(CACHE_ENV_VAR)
    monkeypatch.setenv(USER_CACHE_ENV, str(tmp_path / "user"))
    assert cache_folder() == tmp_path / "user"
    assert cache_dir() == Path("data") / "cmapss"


# --- a configured folder that lacks files: an error, never a fallback ---------------------------


def test_explicit_dir_missing_files_names_them(tmp_path, monkeypatch, closed_port_url):
    explicit = tmp_path / "explicit"
    explicit.mkdir()
    (explicit / "train_FD001.txt").write_text("x\n")
    monkeypatch.setenv(ENV_VAR, str(write_fd001(tmp_path / "env", "env")))  # valid, not used
    write_fd001(tmp_path / "cache", "cache")  # valid, not used

    with pytest.raises(DataUnavailableError) as info:
        locate("FD001", explicit, archive=Archive(urls=(closed_port_url,), md5=None))
    message = str(info.value)
    assert str(explicit) in message
    assert "test_FD001.txt" in message and "RUL_FD001.txt" in message
    assert "train_FD001.txt" not in message


def test_env_dir_missing_files_names_them(tmp_path, monkeypatch, closed_port_url):
    env = tmp_path / "env"
    env.mkdir()
    monkeypatch.setenv(ENV_VAR, str(env))
    write_fd001(tmp_path / "cache", "cache")  # valid, not used

    with pytest.raises(DataUnavailableError) as info:
        locate("FD001", archive=Archive(urls=(closed_port_url,), md5=None))
    message = str(info.value)
    assert ENV_VAR in message and str(env) in message
    for name in FD001_FILES:
        assert name in message


def test_explicit_dir_must_hold_the_requested_subset(tmp_path, closed_port_url):
    explicit = write_fd001(tmp_path / "explicit", "explicit")  # FD001 only
    with pytest.raises(DataUnavailableError, match="train_FD002.txt"):
        locate("FD002", explicit, archive=Archive(urls=(closed_port_url,), md5=None))


def test_no_download_when_disabled(tmp_path, server, source_files):
    body = make_zip(source_files)
    archive = archive_for(server.serve("/CMAPSSData.zip", body), body, source_files)
    with pytest.raises(DataUnavailableError) as info:
        locate("FD001", download=False, archive=archive)
    message = str(info.value)
    assert "downloads are disabled" in message
    assert "CMAPSS_DIR" in message and "--data-dir" in message
    assert server.requests == []
    assert listing(tmp_path / "cache") == []


def test_unknown_subset_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="FD009"):
        locate("FD009", tmp_path)


# --- download_archive ----------------------------------------------------------------------------


@pytest.mark.parametrize("folder", ["CMAPSSData/", "", "outer/CMAPSSData/"])
def test_download_places_verified_files_and_no_temporaries(tmp_path, server, source_files,
                                                           folder):
    body = make_zip(source_files, folder=folder)
    archive = archive_for(server.serve("/data.zip", body), body, source_files)
    destination = tmp_path / "dest"
    destination.mkdir()
    (destination / "keep.txt").write_text("already here\n")

    placed = download_archive(destination, archive)

    assert sorted(p.name for p in placed) == sorted(source_files)
    assert all(p.parent == destination for p in placed)
    assert listing(destination) == sorted([*source_files, "keep.txt"])
    for name, content in source_files.items():
        assert (destination / name).read_bytes() == content
    assert (destination / "keep.txt").read_text() == "already here\n"
    assert not list(destination.glob(".download-*"))
    assert not list(destination.rglob("*.part")) and not list(destination.rglob("*.zip"))


def test_download_creates_the_destination(tmp_path, server, source_files):
    body = make_zip(source_files)
    archive = archive_for(server.serve("/data.zip", body), body, source_files)
    destination = tmp_path / "a" / "b"
    download_archive(destination, archive)
    assert listing(destination) == sorted(source_files)


def test_download_falls_back_to_the_next_url(tmp_path, server, source_files, closed_port_url):
    body = make_zip(source_files)
    good = server.serve("/mirror.zip", body)
    archive = archive_for((closed_port_url, server.url("/missing.zip"), good), body,
                          source_files)
    download_archive(tmp_path / "dest", archive)
    assert server.requests == ["/missing.zip", "/mirror.zip"]
    assert (tmp_path / "dest" / "train_FD001.txt").read_bytes() == source_files["train_FD001.txt"]


def test_file_without_a_sum_is_accepted_on_the_archive_md5(tmp_path, server, source_files):
    body = make_zip(source_files)
    sums = {n: sha256(b) for n, b in source_files.items() if n != "readme.txt"}
    archive = archive_for(server.serve("/data.zip", body), body, source_files, sha256=sums)
    download_archive(tmp_path / "dest", archive)
    assert (tmp_path / "dest" / "readme.txt").read_bytes() == source_files["readme.txt"]


def prepared_destination(tmp_path) -> tuple[Path, list[str]]:
    destination = tmp_path / "dest"
    destination.mkdir()
    (destination / "keep.txt").write_text("already here\n")
    return destination, listing(destination)


def test_wrong_md5_leaves_nothing(tmp_path, server, source_files):
    body = make_zip(source_files)
    archive = archive_for(server.serve("/data.zip", body), body, source_files, md5="0" * 32)
    destination, before = prepared_destination(tmp_path)

    with pytest.raises(DataUnavailableError) as info:
        download_archive(destination, archive)

    message = str(info.value)
    assert "corrupt" in message and "MD5" in message
    assert md5(body) in message and "0" * 32 in message
    assert listing(destination) == before
    assert server.requests == ["/data.zip"]


def test_truncated_archive_fails_the_md5(tmp_path, server, source_files):
    body = make_zip(source_files)
    url = server.serve("/data.zip", body[: len(body) // 2])  # a damaged mirror copy
    archive = archive_for(url, body, source_files)
    destination, before = prepared_destination(tmp_path)
    with pytest.raises(DataUnavailableError, match="MD5"):
        download_archive(destination, archive)
    assert listing(destination) == before


def test_wrong_file_sha256_leaves_nothing(tmp_path, server, source_files):
    body = make_zip(source_files)
    sums = {name: sha256(content) for name, content in source_files.items()}
    sums["test_FD001.txt"] = "f" * 64
    archive = archive_for(server.serve("/data.zip", body), body, source_files, sha256=sums)
    destination, before = prepared_destination(tmp_path)

    with pytest.raises(DataUnavailableError) as info:
        download_archive(destination, archive)

    message = str(info.value)
    assert "test_FD001.txt" in message and "SHA-256" in message and "corrupt" in message
    assert sha256(source_files["test_FD001.txt"]) in message
    # nothing placed, not even the files whose sums were right
    assert listing(destination) == before


def test_corrupt_download_through_locate_leaves_cache_unusable(tmp_path, server, source_files):
    body = make_zip(source_files)
    sums = {name: sha256(content) for name, content in source_files.items()}
    sums["RUL_FD001.txt"] = "0" * 64
    archive = archive_for(server.serve("/data.zip", body), body, source_files, sha256=sums)
    with pytest.raises(DataUnavailableError, match="RUL_FD001.txt"):
        locate("FD001", archive=archive)
    cache = tmp_path / "cache"
    assert listing(cache) == []
    # the next attempt tries again rather than trusting a half-filled cache
    with pytest.raises(DataUnavailableError):
        locate("FD001", archive=archive)
    assert server.requests == ["/data.zip", "/data.zip"]


def test_unreachable_server_explains_how_to_supply_a_local_copy(tmp_path, closed_port_url):
    destination, before = prepared_destination(tmp_path)
    with pytest.raises(DataUnavailableError) as info:
        download_archive(destination, Archive(urls=(closed_port_url,), md5=None))
    message = str(info.value)
    assert closed_port_url in message  # which URL failed
    assert "CMAPSS_DIR" in message and "--data-dir" in message
    assert "train_FDxxx.txt" in message
    assert listing(destination) == before


def test_a_failed_first_download_leaves_no_folder_it_made(tmp_path, closed_port_url):
    """The default cache is data/cmapss: a first `rul train` offline, in a new project
    folder, must not leave an empty data/ behind."""
    with pytest.raises(DataUnavailableError):
        download_archive(tmp_path / "data" / "cmapss", Archive(urls=(closed_port_url,), md5=None))
    assert listing(tmp_path) == []


def test_unreachable_server_through_locate(tmp_path, closed_port_url):
    with pytest.raises(DataUnavailableError) as info:
        locate("FD001", archive=Archive(urls=(closed_port_url,), md5=None))
    message = str(info.value)
    assert "export CMAPSS_DIR=" in message and "--data-dir" in message
    assert str(tmp_path / "cache") in message  # where copied files would be found
    assert listing(tmp_path / "cache") == []


def test_http_error_is_data_unavailable(tmp_path, server):
    destination, before = prepared_destination(tmp_path)
    with pytest.raises(DataUnavailableError, match="404"):
        download_archive(destination, Archive(urls=(server.url("/nope.zip"),), md5=None))
    assert listing(destination) == before


def test_not_a_zip(tmp_path, server):
    body = b"<html>mirror maintenance</html>"
    archive = Archive(urls=(server.serve("/data.zip", body),), md5=None)
    destination, before = prepared_destination(tmp_path)
    with pytest.raises(DataUnavailableError, match="not a valid zip"):
        download_archive(destination, archive)
    assert listing(destination) == before


def test_zip_without_train_files(tmp_path, server):
    files = {"readme.txt": b"nothing here\n"}
    body = make_zip(files)
    archive = archive_for(server.serve("/data.zip", body), body, files)
    destination, before = prepared_destination(tmp_path)
    with pytest.raises(DataUnavailableError, match="no C-MAPSS train_FDxxx.txt"):
        download_archive(destination, archive)
    assert listing(destination) == before


def test_locate_after_download_requires_the_subset_files(tmp_path, server, source_files):
    # An archive (md5 not pinned) that holds train_FD001.txt but not the test and RUL files:
    # locate promises "the directory holding the three files", so it must not return the cache.
    files = {"train_FD001.txt": source_files["train_FD001.txt"]}
    body = make_zip(files)
    archive = archive_for(server.serve("/data.zip", body), body, files, md5=None)
    with pytest.raises(DataUnavailableError, match="test_FD001.txt"):
        locate("FD001", archive=archive)


# --- the official archive -------------------------------------------------------------------------


def read_sums(path: Path) -> dict[str, str]:
    sums = {}
    for line in path.read_text().splitlines():
        if line.strip():
            digest, name = line.split(maxsplit=1)
            sums[name.lstrip("*")] = digest
    return sums


def test_official_archive_sums_match_the_reference_copy(real_data_dir):
    sums_file = real_data_dir / "SHA256SUMS"
    if not sums_file.is_file():
        pytest.skip(f"{sums_file} not found")
    sums = read_sums(sums_file)
    for name in (*FD001_FILES, "readme.txt"):
        if name in sums:
            assert OFFICIAL_ARCHIVE.sha256[name] == sums[name], name
    for name in FD001_FILES:
        assert OFFICIAL_ARCHIVE.sha256[name] == sums[name], name
        # and the reference copy itself is what the sums say
        assert sha256_of(real_data_dir / name) == sums[name], name


def test_official_archive_is_pinned():
    assert OFFICIAL_ARCHIVE.urls and all(u.startswith("https://") for u in OFFICIAL_ARCHIVE.urls)
    assert len(OFFICIAL_ARCHIVE.md5) == 32 and int(OFFICIAL_ARCHIVE.md5, 16) >= 0
    for name in FD001_FILES:
        digest = OFFICIAL_ARCHIVE.sha256[name]
        assert len(digest) == 64 and int(digest, 16) >= 0


# --- where a file is: rul.data.cmapss_file, `rul cmapss-file` ---------------------------------


def test_cmapss_file_is_where_rul_reads_it_the_cache_or_cmapss_dir(tmp_path, monkeypatch):
    from rul.data import cmapss_file

    cache = write_fd001(tmp_path / "cache", "cache")
    assert cmapss_file("test_FD001.txt", download=False) == cache / "test_FD001.txt"
    env = write_fd001(tmp_path / "env", "env")
    monkeypatch.setenv(ENV_VAR, str(env))
    assert cmapss_file("test_FD001.txt") == env / "test_FD001.txt"
    explicit = write_fd001(tmp_path / "explicit", "explicit")
    assert cmapss_file("RUL_FD001.txt", explicit) == explicit / "RUL_FD001.txt"


def test_cmapss_file_is_absolute_from_a_relative_folder(tmp_path, monkeypatch):
    from rul.data import cmapss_file

    write_fd001(tmp_path / "data" / "cmapss", "cache")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(CACHE_ENV_VAR)
    found = cmapss_file("train_FD001.txt", download=False)
    assert found.is_absolute() and found == tmp_path / "data" / "cmapss" / "train_FD001.txt"


def test_the_cli_prints_the_file_or_one_line_naming_what_is_wrong(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from rul.cli import main

    env = write_fd001(tmp_path / "env", "env")
    monkeypatch.setenv(ENV_VAR, str(env))
    said = CliRunner().invoke(main, ["cmapss-file", "test_FD001.txt"])
    assert (said.exit_code, said.output) == (0, f"{env / 'test_FD001.txt'}\n")
    said = CliRunner().invoke(main, ["cmapss-file", "test_FD009.txt"])
    assert said.exit_code == 2 and len(said.output.splitlines()) == 1
    assert "'test_FD009.txt' is not a C-MAPSS file" in said.output
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "nowhere"))
    said = CliRunner().invoke(main, ["cmapss-file", "test_FD001.txt"])
    assert said.exit_code == 2 and said.output.count("\n") == 1
    assert f"CMAPSS_DIR points at {tmp_path / 'nowhere'}" in said.output

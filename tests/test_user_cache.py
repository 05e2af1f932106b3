"""rul's user cache (rul.files.CacheFile) is private to its user and trusted in nothing: its
folders are created 0700 (whatever the umask) and another user's folder is not used; files are
written 0600 through exclusive scratch files and never through a symlink; a kept file that is a
symlink, not a regular file or writable by others is not read. Each doubt is one warning line."""

import os
import stat
import threading

import pytest

from rul import files
from rul.files import CacheFile

ENTRY = "graphs/kept.bin"


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def cache(tmp_path) -> CacheFile:
    return CacheFile(tmp_path / "cache", ENTRY)


@pytest.fixture
def victim(tmp_path):
    """A file outside the cache that nothing rul does to the cache may change."""
    path = tmp_path / "outside" / "victim"
    path.parent.mkdir()
    path.write_bytes(b"untouched")
    return path


def warned(recwarn) -> list[str]:
    return [str(w.message) for w in recwarn]


def test_under_umask_000_the_folders_are_0700_and_the_files_0600(cache, recwarn):
    before = os.umask(0)
    try:
        cache.keep(b"data")
    finally:
        os.umask(before)
    assert cache.read() == b"data"
    assert (mode(cache.root), mode(cache.root / "graphs"), mode(cache.path)) == (
        0o700, 0o700, 0o600)
    assert sorted(p.name for p in cache.path.parent.iterdir()) == ["kept.bin"]  # no scratch
    assert warned(recwarn) == []


def test_a_folder_of_this_user_open_to_others_is_made_private(cache):
    (cache.root / "graphs").mkdir(parents=True)
    for folder in (cache.root, cache.root / "graphs"):
        folder.chmod(0o777)
    assert cache.read() is None
    assert (mode(cache.root), mode(cache.root / "graphs")) == (0o700, 0o700)


def test_a_folder_of_another_user_is_not_used(cache, monkeypatch, recwarn):
    cache.keep(b"data")
    monkeypatch.setattr(os, "geteuid", lambda: os.getuid() + 1)  # the folder is not ours
    assert cache.read() is None
    cache.keep(b"other")
    monkeypatch.undo()
    assert cache.read() == b"data"  # nothing written while it was another user's
    assert warned(recwarn) == [f"rul's cache: {cache.path}: folder cache: owned by user id "
                               f"{os.getuid()}, not by this user; not used"] * 2


def test_a_symlink_planted_as_the_file_is_replaced_never_written_through(cache, victim,
                                                                        recwarn):
    cache.path.parent.mkdir(parents=True)
    cache.path.symlink_to(victim)
    assert cache.read() is None
    cache.keep(b"data")
    assert victim.read_bytes() == b"untouched"
    assert not cache.path.is_symlink() and cache.read() == b"data"
    assert warned(recwarn) == [f"rul's cache: {cache.path}: a symbolic link; not trusted, "
                               "built anew"]


def test_a_symlink_planted_as_the_scratch_file_is_never_written_through(cache, victim,
                                                                       monkeypatch):
    monkeypatch.setattr(files.secrets, "token_hex", lambda n: "0" * 2 * n)
    cache.path.parent.mkdir(parents=True)
    (cache.path.parent / f".kept.bin.{os.getpid()}.00000000.tmp").symlink_to(victim)
    cache.keep(b"data")  # not kept (redone next time), and nothing written elsewhere
    assert victim.read_bytes() == b"untouched"
    assert cache.read() is None


@pytest.mark.parametrize("where", ["root", "graphs"])
def test_a_folder_planted_as_a_symlink_is_not_used(cache, victim, where, recwarn):
    link = cache.root if where == "root" else cache.root / "graphs"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(victim.parent, target_is_directory=True)
    cache.keep(b"data")
    assert sorted(p.name for p in victim.parent.iterdir()) == ["victim"]
    assert cache.read() is None
    assert warned(recwarn) == [f"rul's cache: {cache.path}: folder {link.name}: a symbolic "
                               "link or not a folder; not used"] * 2


def test_a_file_others_may_write_is_not_trusted_and_is_rebuilt(cache, recwarn):
    cache.keep(b"data")
    cache.path.chmod(0o666)
    assert cache.read() is None
    cache.keep(b"again")
    assert (cache.read(), mode(cache.path)) == (b"again", 0o600)
    assert warned(recwarn) == [f"rul's cache: {cache.path}: writable by others (mode 666); not "
                               "trusted, built anew"]


def test_a_named_pipe_in_its_place_is_not_read_and_does_not_block(cache, recwarn):
    cache.path.parent.mkdir(parents=True)
    os.mkfifo(cache.path)
    found = []
    reader = threading.Thread(target=lambda: found.append(cache.read()), daemon=True)
    reader.start()
    reader.join(10)
    assert found == [None]
    assert warned(recwarn) == [f"rul's cache: {cache.path}: not a regular file; not trusted, "
                               "built anew"]


def test_a_cache_that_cannot_be_written_is_no_error(tmp_path, recwarn):
    read_only = tmp_path / "read-only"
    read_only.mkdir(mode=0o500)
    CacheFile(read_only / "cache", ENTRY).keep(b"data")  # PermissionError: nothing said
    if os.geteuid() != 0:  # root writes anyway
        assert list(read_only.iterdir()) == []
    assert warned(recwarn) == []


def test_a_file_the_user_names_leaves_its_folder_as_it_is(tmp_path, monkeypatch):
    """RUL_PRECISION_CACHE may name a file in a project folder: kept and read there, the
    file 0600 as every cache file, and the folder keeps its own mode (it was made 0700)."""
    from rul.training.cpu_probe import cache_entry

    project = tmp_path / "project"
    project.mkdir(mode=0o755)
    project.chmod(0o755)
    monkeypatch.setenv("RUL_PRECISION_CACHE", str(project / "precision.json"))
    entry = cache_entry()
    entry.keep(b"{}")
    assert entry.read() == b"{}" and mode(project / "precision.json") == 0o600
    assert mode(project) == 0o755

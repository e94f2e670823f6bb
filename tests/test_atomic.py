"""AtomicOutput: all-or-nothing output, refusals, cleanup on every failure path."""

from __future__ import annotations

import contextlib
import os
import stat

import pytest

from hurray_interop.files.atomic import AtomicOutput, AtomicOutputSet
from hurray_interop.errors import OutputExistsError, UsageError


def leftovers(d):
    return sorted(p.name for p in d.iterdir() if p.name.endswith(".tmp"))


def test_commit_moves_temp_into_place(tmp_path):
    dest = tmp_path / "out.bin"
    with AtomicOutput(dest) as out:
        out.write(b"hello ")
        out.write(memoryview(b"world"))
        assert out.tell() == 11
        assert out.temp_path.parent == tmp_path and out.temp_path.name.startswith(".out.bin.")
        assert not dest.exists()
        out.commit()
    assert dest.read_bytes() == b"hello world"
    assert leftovers(tmp_path) == []
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(dest.stat().st_mode) == 0o666 & ~umask


def test_no_commit_leaves_nothing(tmp_path):
    dest = tmp_path / "out.bin"
    with AtomicOutput(dest) as out:
        out.write(b"x")
    assert not dest.exists()
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("exc", [RuntimeError("boom"), KeyboardInterrupt()])
def test_exception_removes_temp_and_keeps_existing(tmp_path, exc):
    dest = tmp_path / "out.bin"
    dest.write_bytes(b"original")
    with pytest.raises(type(exc)):
        with AtomicOutput(dest, force=True) as out:
            out.write(b"new content")
            raise exc
    assert dest.read_bytes() == b"original"
    assert leftovers(tmp_path) == []


def test_existing_refused_without_force(tmp_path):
    dest = tmp_path / "out.bin"
    dest.write_bytes(b"original")
    with pytest.raises(OutputExistsError, match=r"out\.bin: output exists"):
        with AtomicOutput(dest):
            pass
    assert dest.read_bytes() == b"original"
    with AtomicOutput(dest, force=True) as out:
        out.write(b"replaced")
        out.commit()
    assert dest.read_bytes() == b"replaced"


def test_file_appearing_meanwhile_is_not_clobbered(tmp_path):
    dest = tmp_path / "out.bin"
    with pytest.raises(OutputExistsError, match="appeared while writing"):
        with AtomicOutput(dest) as out:
            out.write(b"mine")
            dest.write_bytes(b"theirs")
            out.commit()
    assert dest.read_bytes() == b"theirs"
    assert leftovers(tmp_path) == []


def test_same_file_as_input_refused_even_with_force(tmp_path):
    src = tmp_path / "in.bin"
    src.write_bytes(b"data")
    with pytest.raises(UsageError, match="same file as the input"):
        AtomicOutput(tmp_path / "sub" / ".." / "in.bin", force=True, inputs=[src]).open()
    link = tmp_path / "hard.bin"
    os.link(src, link)
    with pytest.raises(UsageError, match="same file as the input"):
        AtomicOutput(link, force=True, inputs=[src]).open()
    sym = tmp_path / "sym.bin"
    sym.symlink_to(src)
    with pytest.raises(UsageError, match="same file as the input"):
        AtomicOutput(sym, force=True, inputs=[src]).open()
    assert src.read_bytes() == b"data"


def test_directory_and_missing_parent(tmp_path):
    with pytest.raises(UsageError, match="is a directory"):
        AtomicOutput(tmp_path, force=True).open()
    with pytest.raises(UsageError, match="does not exist"):
        AtomicOutput(tmp_path / "nope" / "x.bin").open()


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_permission_denied_is_a_one_line_usage_error(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with pytest.raises(UsageError, match="permission denied") as ei:
            AtomicOutput(ro / "x.bin").open()
        assert "\n" not in str(ei.value) and str(ro / "x.bin") in str(ei.value)
    finally:
        ro.chmod(0o755)


def test_not_open_and_double_open(tmp_path):
    a = AtomicOutput(tmp_path / "x.bin")
    with pytest.raises(UsageError, match="not open"):
        a.write(b"x")
    a.open()
    with pytest.raises(UsageError, match="already open"):
        a.open()
    a.abort()
    assert leftovers(tmp_path) == []


def test_permission_error_mapped_without_root_privileges(tmp_path, monkeypatch):
    """Same check as above, runnable as root: make creating the temp file fail with EACCES."""
    import hurray_interop.files.atomic as atomic

    real_open = os.open

    def deny(path, *a, **kw):
        if str(path).endswith(".tmp"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *a, **kw)

    monkeypatch.setattr(atomic.os, "open", deny)
    with pytest.raises(UsageError, match=r"x\.bin: cannot create a file in .*: permission denied$"):
        AtomicOutput(tmp_path / "x.bin").open()


# --------------------------------------------------------------------------
# AtomicOutputSet: several files, all or none
# --------------------------------------------------------------------------


def _write_all(outs, payloads):
    for i, data in enumerate(payloads):
        outs.open(i).write(data)
        outs.close(i)


def test_set_commit_moves_every_member_into_place(tmp_path):
    paths = [tmp_path / f"s{i}.bin" for i in range(3)]
    with AtomicOutputSet(paths) as outs:
        _write_all(outs, [b"a", b"bb", b"ccc"])
        assert not any(p.exists() for p in paths)  # nothing visible before commit
        assert len(leftovers(tmp_path)) == 3
        assert outs.commit() == paths
    assert [p.read_bytes() for p in paths] == [b"a", b"bb", b"ccc"]
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("exc", [RuntimeError("boom"), KeyboardInterrupt()])
def test_set_failure_on_second_member_leaves_nothing(tmp_path, exc):
    paths = [tmp_path / f"s{i}.bin" for i in range(3)]
    with pytest.raises(type(exc)):
        with AtomicOutputSet(paths) as outs:
            outs.open(0).write(b"first")
            outs.close(0)
            outs.open(1).write(b"half")
            raise exc
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_set_checks_every_destination_before_creating_anything(tmp_path):
    paths = [tmp_path / f"s{i}.bin" for i in range(3)]
    paths[2].write_bytes(b"keep")
    with pytest.raises(OutputExistsError, match=r"s2\.bin: output exists"):
        with AtomicOutputSet(paths):
            pass  # pragma: no cover - never entered
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s2.bin"] and paths[2].read_bytes() == b"keep"
    with pytest.raises(UsageError, match="same output path is given twice"):
        AtomicOutputSet([paths[0], tmp_path / "x" / ".." / "s0.bin"]).__enter__()
    with pytest.raises(UsageError, match="same file as the input"):
        AtomicOutputSet([paths[0], paths[2]], force=True, inputs=[paths[2]]).__enter__()
    with AtomicOutputSet(paths, force=True) as outs:
        _write_all(outs, [b"x", b"y", b"z"])
        outs.commit()
    assert paths[2].read_bytes() == b"z"


def test_set_publish_failure_removes_members_already_in_place(tmp_path):
    paths = [tmp_path / f"s{i}.bin" for i in range(3)]
    with pytest.raises(OutputExistsError, match=r"s1\.bin: output appeared while writing"):
        with AtomicOutputSet(paths) as outs:
            _write_all(outs, [b"a", b"b", b"c"])
            paths[1].write_bytes(b"theirs")  # appears after the checks: member 1 cannot be linked
            outs.commit()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s1.bin"]  # s0 was moved in, then removed again
    assert paths[1].read_bytes() == b"theirs"


def test_set_needs_every_member_written(tmp_path):
    paths = [tmp_path / f"s{i}.bin" for i in range(2)]
    with pytest.raises(UsageError, match=r"s1\.bin: output was never written"):
        with AtomicOutputSet(paths) as outs:
            outs.open(0).write(b"a")
            outs.commit()
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(UsageError, match="not open"):
        AtomicOutputSet(paths).open(0)


def _count_syncs(monkeypatch):
    """Record every fsync and every writeback start (sync_file_range / fadvise) of this process."""
    from hurray_interop.files import positional as P

    calls: list[str] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(P, "writeback_function",
                        lambda strategy="auto": (lambda fd, off, n: calls.append("writeback")))
    import hurray_interop.files.atomic as A

    monkeypatch.setattr(A, "writeback_function", P.writeback_function)
    return calls


def test_transient_outputs_are_never_synced_but_written_the_same(tmp_path, monkeypatch):
    from hurray_interop.files.atomic import WRITEBACK_STEP, transient
    from hurray_interop.files.positional import PositionalWriter

    calls = _count_syncs(monkeypatch)
    data = os.urandom(2 * WRITEBACK_STEP + 5)
    seen = {}
    for name, durable in (("durable.bin", True), ("transient.bin", False)):
        calls.clear()
        with contextlib.ExitStack() as stack:
            if not durable:
                stack.enter_context(transient())
            with AtomicOutput(tmp_path / name) as out:
                out.write(data)  # sequential writes: writeback every WRITEBACK_STEP bytes
                PositionalWriter(out, 2 * len(data)).pwrite(data[::-1], len(data))  # positional ones
                out.commit()
        seen[name] = sorted(set(calls))
    assert seen == {"durable.bin": ["fsync", "writeback"], "transient.bin": []}
    assert (tmp_path / "durable.bin").read_bytes() == (tmp_path / "transient.bin").read_bytes()
    assert leftovers(tmp_path) == []


def test_transient_ends_with_its_block(tmp_path):
    from hurray_interop.files.atomic import transient

    with transient():
        assert AtomicOutput(tmp_path / "a").durable is False
    assert AtomicOutput(tmp_path / "b").durable is True

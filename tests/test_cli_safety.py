"""The command line under hostile conditions: exit statuses, one-line errors, nothing lost.

Issue items 2 and 3, end to end through ``hurray_interop.cli.main``:

* malformed input and usage errors exit 2 with exactly one line on stderr that
  names the file (and field/offset for malformed input); refusals exit 1; no
  traceback unless ``--debug``;
* an existing output is kept unless ``--force``; output = input is refused even
  with ``--force`` (same path, hard link, symlink);
* a conversion that fails -- refused tensor, malformed input, Ctrl-C half way,
  disk full half way, unwritable directory -- leaves no output, no temporary
  file, an untouched pre-existing output, and a byte-identical, unmodified input,
  in every direction (GGUF/safetensors -> .hrry, .hrry -> GGUF/safetensors,
  GGUF -> safetensors through the intermediate .hrry).

Root ignores directory permissions, so "read-only directory" is simulated by
making the temporary-file creation fail with EACCES (``os.open`` patched for
that directory only); a real ``chmod`` test runs only for non-root users.
Disk full is simulated by a file object whose writes raise ENOSPC after a byte
budget (patched ``os.fdopen``), the way a full file system answers ``write``.

Defects found by these tests were fixed by their owners; their tests stay as regressions.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import os
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from fuzzing import assert_cli_contract, run_cli
from hurray_interop import convert

# -- inputs ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def files(tmp_path_factory, fixtures_dir) -> dict[str, Path]:
    """Valid inputs of every format, in their own directory (never written to by the tests)."""
    d = tmp_path_factory.mktemp("inputs")
    out = {
        "gguf": d / "tiny.gguf",
        "kquant": d / "kquant.gguf",
        "safetensors": d / "ct.safetensors",
    }
    shutil.copyfile(fixtures_dir / "tiny-llama.gguf", out["gguf"])
    shutil.copyfile(fixtures_dir / "tiny-llama-kquant.gguf", out["kquant"])
    shutil.copyfile(fixtures_dir / "ct-mxfp4-tiny.safetensors", out["safetensors"])
    out["hrry"] = d / "tiny.hrry"
    convert(out["gguf"], out["hrry"])
    out["st_hrry"] = d / "ct.hrry"
    convert(out["safetensors"], out["st_hrry"])
    for p in list(out.values()):
        p.chmod(0o444)
    return out


def fingerprint(p: Path) -> tuple[str, int, int]:
    st = p.stat()
    return hashlib.sha256(p.read_bytes()).hexdigest(), st.st_mtime_ns, st.st_mode


# (source key, destination file name): every conversion direction
DIRECTIONS = [
    ("gguf", "out.hrry"),
    ("safetensors", "out.hrry"),
    ("hrry", "out.gguf"),
    ("st_hrry", "out.safetensors"),
    ("gguf", "out.safetensors"),
]
DIRECTION_IDS = ["gguf-hrry", "st-hrry", "hrry-gguf", "hrry-st", "gguf-st"]


@pytest.fixture
def outdir(tmp_path) -> Path:
    d = tmp_path / "out"
    d.mkdir()
    return d


# -- 2. exit statuses and one-line errors --------------------------------------------------------


@pytest.mark.parametrize(
    "argv,pattern",
    [
        ([], "no command given"),
        (["frobnicate"], "invalid choice"),
        (["convert", "only-one-arg.gguf"], "the following arguments are required"),
        (["convert", "{gguf}", "x.hrry", "--fallback", "int3"], "invalid choice: 'int3'"),
        (["convert", "{gguf}", "x.unknown-extension"], "x.unknown-extension"),
        (["convert", "{gguf}", "{gguf}", "--force"], "output is the input"),
        (["convert", "{missing}", "x.hrry"], "missing.gguf"),
        (["inspect", "{missing}"], "missing.gguf"),
    ],
    ids=["no-command", "unknown-command", "missing-arg", "bad-choice", "unknown-ext", "same-file", "missing-input", "inspect-missing"],
)
def test_usage_errors_exit_2_with_one_line(files, outdir, monkeypatch, argv, pattern):
    monkeypatch.chdir(outdir)
    argv = [a.format(gguf=files["gguf"], missing=outdir / "missing.gguf") for a in argv]
    status, out, err = run_cli(argv)
    assert status == 2, (status, err)
    assert_cli_contract(status, err)
    assert pattern in err
    assert os.listdir(outdir) == []


def _corrupt(src: Path, dst: Path, at: int, value: bytes) -> Path:
    raw = bytearray(src.read_bytes())
    raw[at : at + len(value)] = value
    dst.write_bytes(raw)
    return dst


@pytest.mark.parametrize("kind", ["gguf", "hrry", "safetensors"])
@pytest.mark.parametrize("command", ["convert", "inspect"])
def test_malformed_input_exits_2_with_a_located_line(files, tmp_path, outdir, kind, command):
    """A lying count or length in each format: exit 2, one line with the file, field and offset."""
    bad_dir = tmp_path / "bad"
    bad_dir.mkdir()
    if kind == "gguf":  # tensor count 2**63
        bad = _corrupt(files["gguf"], bad_dir / "bad.gguf", 8, struct.pack("<Q", 2**63))
        where = "header counts at offset 8"
    elif kind == "hrry":  # data_buffer_alignment 1000
        bad = _corrupt(files["hrry"], bad_dir / "bad.hrry", 16, struct.pack("<I", 1000))
        where = "data_buffer_alignment at offset 16"
    else:  # data section cut short: the last tensor's data_offsets run past the end
        bad = bad_dir / "bad.safetensors"
        bad.write_bytes(files["safetensors"].read_bytes()[:-100])
        where = "data_offsets at offset "
    before = bad.read_bytes()
    dst = outdir / ("o.gguf" if kind == "hrry" else "o.hrry")
    argv = ["convert", os.fspath(bad), os.fspath(dst)] if command == "convert" else ["inspect", os.fspath(bad)]
    status, out, err = run_cli(argv)
    assert status == 2
    assert_cli_contract(status, err, output=dst, before=set())
    assert err.startswith(f"hurray-interop: error: {bad}: ") and where in err, err
    assert bad.read_bytes() == before


# -- every malformation of issue item 1, through the command line -----------------------------


def _s(b: bytes) -> bytes:
    return struct.pack("<Q", len(b)) + b


def _gguf(kvs: list[bytes], infos: list[bytes], data: bytes = b"", *, n_t: int | None = None, version: int = 3) -> bytes:
    head = b"GGUF" + struct.pack("<IQQ", version, len(infos) if n_t is None else n_t, len(kvs))
    meta = head + b"".join(kvs) + b"".join(infos)
    return meta + bytes(-len(meta) % 32) + data


def _info(name: bytes, ne: list[int], type_id: int, offset: int) -> bytes:
    return _s(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne) + struct.pack("<IQ", type_id, offset)


def _st(header: str | bytes, data: bytes = b"") -> bytes:
    h = header.encode() if isinstance(header, str) else header
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def _st_entry(name: str, dtype: str, shape: list, offs: list) -> str:
    import json

    return f'"{name}":' + json.dumps({"dtype": dtype, "shape": shape, "data_offsets": offs})


_KV_U32 = _s(b"k") + struct.pack("<II", 4, 7)
_W = _info(b"w", [4], 0, 0)
GGUF_MALFORMED = {
    "bad-magic": b"GGUX" + _gguf([], [])[4:],
    "unsupported-version": _gguf([], [], version=4),
    "truncated-in-kv": _gguf([_KV_U32, _s(b"j") + struct.pack("<II", 4, 7)], [])[:56],  # inside the 2nd value
    "2**63-tensors": _gguf([], [], n_t=2**63),
    "4GiB-string": _gguf([_s(b"k")[:8].replace(b"\x01", b"\x01") + b"k" + struct.pack("<IQ", 8, 2**32)], []),
    "2**40-element-shape": _gguf([], [_info(b"w", [2**20, 2**20], 0, 0)], bytes(32)),
    "out-of-file-data": _gguf([], [_info(b"w", [4], 0, 64)], bytes(32)),
    "overlap": _gguf([], [_info(b"a", [16], 0, 0), _info(b"b", [4], 0, 32)], bytes(64)),
    "misaligned-offset": _gguf([], [_info(b"w", [4], 0, 16)], bytes(64)),
    "duplicate-tensor": _gguf([], [_W, _info(b"w", [4], 0, 32)], bytes(64)),
    "duplicate-key": _gguf([_KV_U32, _KV_U32], []),
    "unknown-value-type": _gguf([_s(b"k") + struct.pack("<II", 13, 0)], []),
    "unknown-ggml-type": _gguf([], [_info(b"w", [32], 99, 0)], bytes(64)),
    "nested-array-bomb": _gguf([_s(b"k") + struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * 40 + struct.pack("<IQ", 0, 0)], []),
}
ST_MALFORMED = {
    "truncated-header": _st("{" + _st_entry("a", "U8", [1], [0, 1]) + "}", b"x")[:20],
    "2**40-element-shape": _st("{" + _st_entry("a", "F32", [2**20, 2**20], [0, 1]) + "}", b"x"),
    "out-of-file-data": _st("{" + _st_entry("a", "U8", [8], [0, 8]) + "}", b"x"),
    "overlap": _st("{" + _st_entry("a", "U8", [2], [0, 2]) + "," + _st_entry("b", "U8", [2], [1, 3]) + "}", b"xyz"),
    "invalid-utf8": _st(b'{"\xff' + _st_entry("a", "U8", [1], [0, 1]).encode()[1:] + b"}", b"x"),
    "unknown-dtype": _st("{" + _st_entry("a", "Q9", [1], [0, 1]) + "}", b"x"),
    "nesting-bomb": _st('{"__metadata__":' + "[" * 100_000 + "]" * 100_000 + "}"),
}


def _hrry_malformed(base: bytes) -> dict[str, bytes]:
    import crc32c

    ioff, ilen = struct.unpack_from("<QQ", base, len(base) - 40)
    (ln,) = struct.unpack_from("<H", base, ioff + 8)
    tail = ioff + 10 + ln  # entry 0: u64 descriptor_offset, u32 descriptor_length, u64 data_offset, u64 data_length, u32 flags
    (doff,) = struct.unpack_from("<Q", base, tail)

    def patched(at: int, value: bytes, crc: bool = True) -> bytes:
        b = bytearray(base)
        b[at : at + len(value)] = value
        if crc:
            struct.pack_into("<I", b, len(b) - 12, crc32c.crc32c(bytes(b[ioff : ioff + ilen])))
        return bytes(b)

    return {
        "bad-magic": patched(0, b"HRRYFILX", crc=False),
        "unsupported-version": patched(8, b"\x02", crc=False),
        "truncated-trailer": base[:-1],
        "2**63-index-entries": patched(ioff, struct.pack("<Q", 2**63)),
        "bad-crc": patched(ioff + 10, b"\xff", crc=False),
        "invalid-utf8-name": patched(ioff + 10, b"\xff"),
        "out-of-file-data": patched(tail + 20, struct.pack("<Q", 2**40)),
        "misaligned-data": patched(tail + 12, struct.pack("<Q", struct.unpack_from("<Q", base, tail + 12)[0] + 8)),
        "overlap": patched(tail, struct.pack("<Q", struct.unpack_from("<Q", base, tail + 12)[0])),  # descriptor onto the data
        "unknown-element-type": patched(doff + 14, b"\xee"),  # type_tag 0xEE (reserved)
    }


@pytest.fixture(scope="module")
def malformed_hrry(tmp_path_factory) -> dict[str, bytes]:
    hurray = pytest.importorskip("hurray")
    p = tmp_path_factory.mktemp("hr") / "ref.hrry"
    hurray.save(os.fspath(p), {"a": hurray.from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))}, kv={"n": 1})
    return _hrry_malformed(p.read_bytes())


MATRIX = [("gguf", k) for k in GGUF_MALFORMED] + [("safetensors", k) for k in ST_MALFORMED] + [
    ("hrry", k) for k in ("bad-magic", "unsupported-version", "truncated-trailer", "2**63-index-entries", "bad-crc",
                          "invalid-utf8-name", "out-of-file-data", "misaligned-data", "overlap", "unknown-element-type")
]


#: the check each case must trip (a distinctive part of its one line)
EXPECT = {
    ("gguf", "bad-magic"): "magic at offset 0", ("gguf", "unsupported-version"): "version at offset 4: GGUF version 4",
    ("gguf", "truncated-in-kv"): "metadata 'j' at offset 54: needs 4 bytes",
    ("gguf", "2**63-tensors"): "9223372036854775808 tensor infos cannot fit",
    ("gguf", "4GiB-string"): "string length 4294967296 exceeds", ("gguf", "2**40-element-shape"): "(4398046511104 bytes) extends past",
    ("gguf", "out-of-file-data"): "extends past the end of the file", ("gguf", "overlap"): "overlaps tensor 'a'",
    ("gguf", "misaligned-offset"): "not a multiple of the alignment", ("gguf", "duplicate-tensor"): "duplicate tensor name",
    ("gguf", "duplicate-key"): "duplicate metadata key 'k'", ("gguf", "unknown-value-type"): "invalid GGUF value type 13",
    ("gguf", "unknown-ggml-type"): "unknown GGML type id 99", ("gguf", "nested-array-bomb"): "nested deeper than 8",
    ("safetensors", "truncated-header"): "runs past the end", ("safetensors", "2**40-element-shape"): "needs 4398046511104",
    ("safetensors", "out-of-file-data"): "run past the 1-byte data section", ("safetensors", "overlap"): "overlaps the previous tensor",
    ("safetensors", "invalid-utf8"): "not UTF-8", ("safetensors", "unknown-dtype"): "'Q9' is not supported",
    ("safetensors", "nesting-bomb"): "not valid JSON",
    ("hrry", "bad-magic"): "magic at offset 0", ("hrry", "unsupported-version"): "container version 2.0",
    ("hrry", "truncated-trailer"): "trailer magic", ("hrry", "2**63-index-entries"): "index_entry_count 9223372036854775808",
    ("hrry", "bad-crc"): "index CRC-32C is", ("hrry", "invalid-utf8-name"): "not valid UTF-8",
    ("hrry", "out-of-file-data"): "extends past the tensor data", ("hrry", "misaligned-data"): "not a multiple of data_buffer_alignment",
    ("hrry", "overlap"): "overlaps data of tensor 'a'", ("hrry", "unknown-element-type"): "type_tag 0xee",
}


@pytest.mark.parametrize("fmt,case", MATRIX, ids=[f"{f}-{c}" for f, c in MATRIX])
def test_every_malformation_is_one_located_line(tmp_path, malformed_hrry, fmt, case):
    """Issue item 1 x item 2: each malformation, through ``inspect`` and ``convert``: exit 2
    (or UnsupportedError's 2), one line naming the file and a byte offset, no output."""
    raw = {"gguf": GGUF_MALFORMED, "safetensors": ST_MALFORMED, "hrry": malformed_hrry}[fmt][case]
    ext = {"gguf": ".gguf", "safetensors": ".safetensors", "hrry": ".hrry"}[fmt]
    src = tmp_path / f"bad{ext}"
    src.write_bytes(raw)
    out = tmp_path / "out"
    out.mkdir()
    dst = out / ("o.gguf" if fmt == "hrry" else "o.hrry")
    for argv in (["inspect", os.fspath(src)], ["convert", os.fspath(src), os.fspath(dst), "--from", {"hrry": "hurray"}.get(fmt, fmt)]):
        status, _, err = run_cli(argv)
        assert status == 2, (argv[0], err)
        assert_cli_contract(status, err, output=dst if argv[0] == "convert" else None, before=set())
        assert err.startswith(f"hurray-interop: error: {src}: ") and "offset " in err, (argv[0], err)
        assert EXPECT[fmt, case] in err, (argv[0], err)
    assert src.read_bytes() == raw


def test_refusal_exits_1_and_writes_nothing(files, outdir):
    dst = outdir / "k.hrry"
    status, out, err = run_cli(["convert", os.fspath(files["kquant"]), os.fspath(dst), "-q"])
    assert status == 1
    assert_cli_contract(status, err, output=dst, before=set())
    lines = err.splitlines()
    assert all(line.startswith("hurray-interop: ") for line in lines)
    assert any("Q4_K" in line for line in lines) and any("Q6_K" in line for line in lines)


def test_debug_shows_the_traceback(files, tmp_path, outdir):
    bad = _corrupt(files["gguf"], tmp_path / "bad.gguf", 0, b"GGUX")
    dst = outdir / "o.hrry"
    status, _, err = run_cli(["--debug", "convert", os.fspath(bad), os.fspath(dst)])
    assert status == 2
    assert "Traceback (most recent call last)" in err and "BadMagicError" in err
    assert err.splitlines()[-1].startswith(f"hurray-interop: error: {bad}: magic at offset 0")
    status, _, err = run_cli(["convert", os.fspath(bad), os.fspath(dst)])
    assert status == 2 and "Traceback" not in err and len(err.splitlines()) == 1
    assert not dst.exists()


# -- 3. nothing lost -------------------------------------------------------------------------------


def test_existing_output_kept_without_force_replaced_with_force(files, outdir):
    dst = outdir / "o.hrry"
    dst.write_bytes(b"precious")
    status, _, err = run_cli(["convert", os.fspath(files["gguf"]), os.fspath(dst), "-q"])
    assert status == 2 and "exists" in err and "--force" in err
    assert_cli_contract(status, err)
    assert dst.read_bytes() == b"precious" and os.listdir(outdir) == ["o.hrry"]
    status, _, err = run_cli(["convert", os.fspath(files["gguf"]), os.fspath(dst), "-q", "--force"])
    assert status == 0, err
    from hurray_interop.core.hrry import HrryFile

    with HrryFile(dst) as f:
        f.validate()
        assert len(f) > 20
    assert sorted(os.listdir(outdir)) == ["o.hrry"]


@pytest.mark.parametrize("how", ["same-path", "dot-path", "hard-link", "symlink"])
def test_output_equal_to_input_is_refused_even_with_force(files, tmp_path, how):
    d = tmp_path / "same"
    d.mkdir()
    src = d / "m.gguf"
    shutil.copyfile(files["gguf"], src)
    fp = fingerprint(src)
    if how == "same-path":
        dst = src
    elif how == "dot-path":
        dst = d / "." / "m.gguf"
    elif how == "hard-link":
        dst = d / "alias.gguf"
        os.link(src, dst)
    else:
        dst = d / "alias.gguf"
        dst.symlink_to(src)
    listing = sorted(os.listdir(d))
    for extra in ([], ["--force"], ["--force", "--to", "hurray"]):
        status, _, err = run_cli(["convert", os.fspath(src), os.fspath(dst), "-q", *extra])
        assert status == 2, (how, extra, err)
        assert_cli_contract(status, err)
        assert fingerprint(src) == fp and sorted(os.listdir(d)) == listing


def test_refused_conversion_keeps_an_existing_output_even_with_force(files, outdir):
    dst = outdir / "k.hrry"
    dst.write_bytes(b"precious")
    status, _, err = run_cli(["convert", os.fspath(files["kquant"]), os.fspath(dst), "-q", "--force"])
    assert status == 1
    assert dst.read_bytes() == b"precious" and os.listdir(outdir) == ["k.hrry"]


class _Interrupt(KeyboardInterrupt):
    pass


def _progress_calls(src: Path, dst: Path) -> int:
    calls = []
    convert(src, dst, progress=lambda done, total: calls.append((done, total)), fallback="float32")
    dst.unlink()
    return len(calls)


@pytest.mark.parametrize("src_key,dst_name", DIRECTIONS, ids=DIRECTION_IDS)
def test_ctrl_c_half_way_leaves_nothing(files, outdir, src_key, dst_name):
    """KeyboardInterrupt from the progress callback half way through the tensors: the
    interrupt propagates, no output and no temporary file exist, an existing output
    (with force) is untouched, the input is unmodified."""
    src = files[src_key]
    dst = outdir / dst_name
    n = _progress_calls(src, dst)
    assert n >= 2, "the conversion reports progress per tensor"
    fp = fingerprint(src)
    for force in (False, True):
        if force:
            dst.write_bytes(b"precious")
        calls = []

        def progress(done: int, total: int) -> None:
            calls.append(done)
            if len(calls) == n // 2 + 1:
                raise _Interrupt()

        with pytest.raises(_Interrupt):
            convert(src, dst, progress=progress, force=force, fallback="float32")
        assert len(calls) == n // 2 + 1
        assert sorted(os.listdir(outdir)) == ([dst.name] if force else [])  # no temporary file either
        if force:
            assert dst.read_bytes() == b"precious"
        assert fingerprint(src) == fp


def test_ctrl_c_through_the_cli_exits_130_with_one_line(files, outdir, monkeypatch):
    from hurray_interop import cli

    @contextlib.contextmanager
    def progress(enabled: bool, desc: str):
        def update(done: int, total: int) -> None:
            if done * 2 >= total:
                raise KeyboardInterrupt

        yield update

    monkeypatch.setattr(cli, "_progress", progress)
    dst = outdir / "o.hrry"
    status, _, err = run_cli(["convert", os.fspath(files["gguf"]), os.fspath(dst)])
    assert status == 130
    assert err == "hurray-interop: interrupted; no output written\n"
    assert os.listdir(outdir) == []


class _FullDisk(io.RawIOBase):
    """A write-only file that accepts ``budget`` bytes, then fails like a full file system."""

    #: the open ones by descriptor: positional writes (os.pwrite, os.copy_file_range) spend the budget too
    open_disks: dict[int, "_FullDisk"] = {}

    def __init__(self, fd: int, budget: int) -> None:
        self._f = io.FileIO(fd, "wb")
        self._left = budget
        _FullDisk.open_disks[fd] = self

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        return self._f.seek(pos, whence)

    def tell(self) -> int:
        return self._f.tell()

    def spend(self, n: int) -> None:
        if n > self._left:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._left -= n

    def write(self, b) -> int:  # type: ignore[override]
        self.spend(memoryview(b).nbytes)
        return self._f.write(b)

    @classmethod
    def patch_positional(cls, monkeypatch: pytest.MonkeyPatch) -> None:
        """os.pwrite and os.copy_file_range into an open _FullDisk spend its budget."""
        real_pwrite, real_copy = os.pwrite, getattr(os, "copy_file_range", None)

        def pwrite(fd: int, data, offset: int) -> int:  # noqa: ANN001
            if fd in cls.open_disks:
                cls.open_disks[fd].spend(memoryview(data).nbytes)
            return real_pwrite(fd, data, offset)

        def copy_file_range(src: int, dst: int, count: int, *a) -> int:  # noqa: ANN002
            if dst in cls.open_disks:
                cls.open_disks[dst].spend(count)
            return real_copy(src, dst, count, *a)  # type: ignore[misc]

        monkeypatch.setattr(os, "pwrite", pwrite)
        if real_copy is not None:
            monkeypatch.setattr(os, "copy_file_range", copy_file_range)

    def fileno(self) -> int:
        return self._f.fileno()

    def flush(self) -> None:
        self._f.flush()

    def close(self) -> None:
        if not self.closed:
            _FullDisk.open_disks.pop(self._f.fileno(), None)
            super().close()  # flushes first
            self._f.close()


@pytest.mark.parametrize("src_key,dst_name", DIRECTIONS, ids=DIRECTION_IDS)
def test_disk_full_half_way_exits_2_and_leaves_nothing(files, outdir, monkeypatch, src_key, dst_name):
    src = files[src_key]
    dst = outdir / dst_name
    convert(src, dst, fallback="float32")
    full_size = dst.stat().st_size
    dst.write_bytes(b"precious")
    fp = fingerprint(src)
    real_fdopen = os.fdopen

    def fdopen(fd, mode="r", *a, **kw):
        if "w" in mode and os.path.dirname(os.readlink(f"/proc/self/fd/{fd}")) in (os.fspath(outdir), ):
            return _FullDisk(fd, full_size // 2)
        return real_fdopen(fd, mode, *a, **kw)

    monkeypatch.setattr(os, "fdopen", fdopen)
    _FullDisk.patch_positional(monkeypatch)
    if src_key == "gguf" and dst_name.endswith(".safetensors"):
        # the intermediate .hrry lives in a temporary directory inside outdir: fail there too
        def fdopen(fd, mode="r", *a, **kw):  # noqa: F811
            if "w" in mode and os.readlink(f"/proc/self/fd/{fd}").startswith(os.fspath(outdir)):
                return _FullDisk(fd, full_size // 2)
            return real_fdopen(fd, mode, *a, **kw)

        monkeypatch.setattr(os, "fdopen", fdopen)
    status, _, err = run_cli(["convert", os.fspath(src), os.fspath(dst), "-q", "--force", "--fallback", "float32"])
    assert status == 2, err
    assert_cli_contract(status, err)
    assert "No space left on device" in err and os.fspath(outdir) in err, err
    assert sorted(os.listdir(outdir)) == [dst.name] and dst.read_bytes() == b"precious"
    assert fingerprint(src) == fp


@pytest.mark.parametrize("src_key,dst_name", DIRECTIONS, ids=DIRECTION_IDS)
def test_unwritable_directory_exits_2_with_one_line(files, outdir, monkeypatch, src_key, dst_name):
    """EACCES on creating the temporary file (what a read-only directory answers; root
    ignores modes, so the answer is injected for ``outdir`` only)."""
    real_open = os.open
    real_mkdir = os.mkdir

    def deny(path, flags, *a, **kw):
        if flags & os.O_CREAT and os.path.dirname(os.path.abspath(path)).startswith(os.fspath(outdir)):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
        return real_open(path, flags, *a, **kw)

    def deny_mkdir(path, *a, **kw):
        if os.path.dirname(os.path.abspath(path)).startswith(os.fspath(outdir)):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
        return real_mkdir(path, *a, **kw)

    monkeypatch.setattr(os, "open", deny)
    monkeypatch.setattr(os, "mkdir", deny_mkdir)
    src = files[src_key]
    fp = fingerprint(src)
    dst = outdir / dst_name
    status, _, err = run_cli(["convert", os.fspath(src), os.fspath(dst), "-q", "--fallback", "float32"])
    assert status == 2
    assert_cli_contract(status, err)
    assert "ermission denied" in err, err
    assert os.listdir(outdir) == [] and fingerprint(src) == fp


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions (the injected variant above runs instead)")
def test_read_only_directory_for_real(files, outdir):
    outdir.chmod(0o555)
    try:
        status, _, err = run_cli(["convert", os.fspath(files["gguf"]), os.fspath(outdir / "o.hrry"), "-q"])
        assert status == 2 and "ermission denied" in err
        assert_cli_contract(status, err)
        assert os.listdir(outdir) == []
    finally:
        outdir.chmod(0o755)


def test_failed_commit_rename_keeps_the_old_output(files, outdir, monkeypatch):
    """The last step (rename over the old file, with --force) fails: the old output stays,
    the temporary file is removed."""
    dst = outdir / "o.hrry"
    dst.write_bytes(b"precious")

    def replace(a, b):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "replace", replace)
    status, _, err = run_cli(["convert", os.fspath(files["gguf"]), os.fspath(dst), "-q", "--force"])
    assert status == 2 and "Input/output error" in err
    assert_cli_contract(status, err)
    assert os.listdir(outdir) == ["o.hrry"] and dst.read_bytes() == b"precious"


@pytest.mark.parametrize("src_key,dst_name", DIRECTIONS, ids=DIRECTION_IDS)
def test_fsync_failure_leaves_nothing(files, outdir, monkeypatch, src_key, dst_name):
    """fsync of the finished temporary file fails (EIO: the data may not be on disk): the
    output is not moved into place, the old output is kept, exit 2 with one line."""
    dst = outdir / dst_name
    dst.write_bytes(b"precious")
    real_fsync = os.fsync

    def fsync(fd):
        if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).endswith(".tmp"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    status, _, err = run_cli(["convert", os.fspath(files[src_key]), os.fspath(dst), "-q", "--force", "--fallback", "float32"])
    assert status == 2 and "Input/output error" in err, err
    assert_cli_contract(status, err)
    assert sorted(os.listdir(outdir)) == [dst.name] and dst.read_bytes() == b"precious"


@pytest.mark.parametrize("force", [False, True], ids=["link", "replace"])
def test_output_is_fsynced_before_it_is_moved_into_place(files, outdir, monkeypatch, force):
    """The order of events of a conversion's last step: fsync(temporary file) ->
    link/rename onto DST -> fsync(directory), and the temporary file is gone afterwards."""
    events: list[tuple[str, str]] = []
    real_fsync, real_link, real_replace = os.fsync, os.link, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def link(a, b, *args, **kw):
        events.append(("link", f"{os.fspath(a)} -> {os.fspath(b)}"))
        return real_link(a, b, *args, **kw)

    def replace(a, b, *args, **kw):
        events.append(("replace", f"{os.fspath(a)} -> {os.fspath(b)}"))
        return real_replace(a, b, *args, **kw)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "link", link)
    monkeypatch.setattr(os, "replace", replace)
    dst = outdir / "o.hrry"
    if force:
        dst.write_bytes(b"old")
    status, _, err = run_cli(["convert", os.fspath(files["gguf"]), os.fspath(dst), "-q", *(["--force"] if force else [])])
    assert status == 0, err
    moves = [i for i, (kind, what) in enumerate(events) if kind in ("link", "replace") and what.endswith(f" -> {dst}")]
    assert len(moves) == 1, events
    m = moves[0]
    tmp = events[m][1].split(" -> ")[0]
    assert os.path.dirname(tmp) == os.fspath(outdir) and os.path.basename(tmp).startswith(".o.hrry.")
    assert ("fsync", tmp) in events[:m], events
    assert ("fsync", os.fspath(outdir)) in events[m + 1 :], events
    assert events[m][0] == ("replace" if force else "link")
    assert os.listdir(outdir) == ["o.hrry"]


# -- regressions for defects found here (fixed by the owners of the code) ----------------------------


def test_disk_full_in_the_intermediate_step_names_the_output(files, outdir, monkeypatch):
    """Found here, fixed in a8e789b: GGUF -> safetensors goes through
    ``<outdir>/.hurray-interop-XXXX/intermediate.hrry``; when that write failed (disk full) the
    one line named the intermediate file, gone by the time the user reads it.  Now it names DST."""
    src, dst = files["gguf"], outdir / "o.safetensors"
    real_fdopen = os.fdopen

    def fdopen(fd, mode="r", *a, **kw):
        if "w" in mode and os.readlink(f"/proc/self/fd/{fd}").startswith(os.fspath(outdir)):
            return _FullDisk(fd, 20_000)
        return real_fdopen(fd, mode, *a, **kw)

    monkeypatch.setattr(os, "fdopen", fdopen)
    status, _, err = run_cli(["convert", os.fspath(src), os.fspath(dst), "-q"])
    assert status == 2 and os.listdir(outdir) == []
    assert err.startswith(f"hurray-interop: error: {dst}"), err


def test_verify_reports_malformed_input_as_one_line_on_stderr(files, tmp_path):
    """Found here, fixed in f391564: ``verify`` of a malformed file wrote its error only to stdout
    (the path twice) and nothing to stderr.  Now (issue item 2): one line on stderr."""
    bad = _corrupt(files["gguf"], tmp_path / "bad.gguf", 8, struct.pack("<Q", 2**63))
    status, out, err = run_cli(["verify", os.fspath(bad)])
    assert status == 2
    assert len(err.splitlines()) == 1 and err.startswith(f"hurray-interop: error: {bad}: header counts at offset 8"), (out, err)


def test_verify_nonzero_gguf_padding_is_reported_not_a_crash(fixtures_dir, tmp_path):
    """Found here, fixed in f391564: a GGUF whose end padding holds a non-zero byte made verify's
    byte comparison close a memory map under live numpy views -> "internal error: BufferError".
    Now the difference is reported (exit 1, or 0 if padding differences are accepted)."""
    raw = bytearray((fixtures_dir / "kv-types.gguf").read_bytes())
    assert raw[1716] == 0  # inside the end padding after the last tensor (data ends at 1696)
    raw[1716] = 0x80
    p = tmp_path / "pad.gguf"
    p.write_bytes(raw)
    status, out, err = run_cli(["verify", os.fspath(p)])
    assert "internal error" not in err, err
    assert status in (0, 1), (status, out, err)


@pytest.mark.parametrize("dst_name", ["o.gguf", "o.safetensors"])
def test_dynamic_dimension_export_is_a_typed_refusal(tmp_path, dst_name):
    """Found here, fixed in 437af4e (GGUF) and by the safetensors exporter's owner: a .hrry
    tensor with a dynamic dimension (shape[k] = 2**64-1, legal in the format and read as
    ``None``) hit ``int(None)`` in the exporters -> "internal error: TypeError".  Now a typed
    refusal naming the tensor (exit 1 or 2, one line, no output)."""
    hurray = pytest.importorskip("hurray")
    src = tmp_path / "dyn.hrry"
    hurray.save(os.fspath(src), {"a": hurray.from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))})
    raw = bytearray(src.read_bytes())
    ioff, _ = struct.unpack_from("<QQ", raw, len(raw) - 40)
    (ln,) = struct.unpack_from("<H", raw, ioff + 8)
    (doff,) = struct.unpack_from("<Q", raw, ioff + 10 + ln)
    assert struct.unpack_from("<IQQ", raw, doff + 16) == (2, 2, 3)  # rank, shape
    struct.pack_into("<Q", raw, doff + 28, 2**64 - 1)
    src.write_bytes(raw)
    from hurray_interop.core.hrry import HrryFile

    with HrryFile(src) as f:
        assert f.descriptor("a").shape == (2, None)
    dst = tmp_path / dst_name
    status, _, err = run_cli(["convert", os.fspath(src), os.fspath(dst)])
    assert "internal error" not in err, err
    assert status in (1, 2) and "'a'" in err
    assert not dst.exists()

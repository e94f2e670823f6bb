"""``convert SRC DST [options]`` followed by ``verify SRC DST [the same options]`` passes, for
every option combination the README documents, over the fixtures (GGUF, K-quant GGUF, split
set, safetensors MX checkpoints) -- CLI level (issue #20).

A lossy conversion (a float16/bfloat16 fallback, ``--q4-1 requantize``) passes "lossy as
reported": DST is byte for byte what the conversion writes and the tensors its report calls
lossy are named with their max abs error.  The same pair verified with *other* options, or
without the options that made it lossy, fails (exit 1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hurray_interop.cli import main

#: what each run adds, to show that these options change nothing for verify
PASSING = ([], ["--force"], ["--jobs", "1"], ["--quiet"], ["--json"])

# (case id, source: a fixture or an earlier step's output, DST name, options)
CHAIN = {
    # GGUF import
    "gguf": ("fixtures/tiny-llama.gguf", "t.hrry", []),
    "gguf-from-to": ("fixtures/tiny-llama.gguf", "t.hrry", ["--from", "gguf", "--to", "hurray"]),
    "gguf-q41-overlay": ("fixtures/tiny-llama.gguf", "t.hrry", ["--q4-1", "overlay"]),
    "gguf-q41-requantize": ("fixtures/tiny-llama.gguf", "t.hrry", ["--q4-1", "requantize"]),
    **{f"gguf-fallback-{f}": ("fixtures/tiny-llama.gguf", "t.hrry", ["--fallback", f])
       for f in ("float32", "float16", "bfloat16", "exact")},
    # K-quant GGUF import: refused without a fallback, so every fallback
    **{f"kquant-fallback-{f}": ("fixtures/tiny-llama-kquant.gguf", "k.hrry", ["--fallback", f])
       for f in ("float32", "float16", "bfloat16", "exact")},
    "kquant-float16-requantize": ("fixtures/tiny-llama-kquant.gguf", "k.hrry", ["--fallback", "float16", "--q4-1", "requantize"]),
    # GGUF export
    "gguf-export": ("@gguf", "back.gguf", []),
    "kquant-exact-export": ("@kquant-fallback-exact", "back.gguf", []),
    "kquant-float16-export": ("@kquant-fallback-float16", "back.gguf", ["--fallback", "float16"]),
    "gguf-export-split-tensors": ("@gguf", "out/t.gguf", ["--split-max-tensors", "10"]),
    "gguf-export-split-size": ("@gguf", "out/t.gguf", ["--split-max-size", "1M"]),
    # split set import and export
    "split": ("fixtures/tiny-split-00002-of-00003.gguf", "s.hrry", []),
    "split-export": ("@split", "out/s-00001-of-00003.gguf", []),
    "split-export-prefix": ("@split", "out/s.gguf", []),
    "split-merge": ("@split", "merged.gguf", ["--merge"]),
    "split-resplit": ("@split", "out/r.gguf", ["--split-max-tensors", "4"]),
    # DST an existing directory, as cp takes it: DIR/<stem>.<ext>
    "gguf-into-directory": ("fixtures/tiny-llama.gguf", "out/", []),
    "split-export-into-directory": ("@split", "out/", []),
    # safetensors MX checkpoints: import, export in every convention that holds them
    **{f"st-{m}": (f"fixtures/{m}.safetensors", f"{m}.hrry", []) for m in ("gpt-oss-tiny", "ct-mxfp4-tiny", "mxfp8-tiny")},
    "st-export": ("@st-gpt-oss-tiny", "back.safetensors", []),
    **{f"st-convention-{c}": ("@st-gpt-oss-tiny", "c.safetensors", ["--convention", c])
       for c in ("gpt-oss", "compressed-tensors", "mxfp8")},
    "st-ct-convention-mxfp8": ("@st-ct-mxfp4-tiny", "c.safetensors", ["--convention", "mxfp8"]),
    # a .hrry of MX tensors without a GGML type, to GGUF with a float fallback (value-exact or lossy)
    **{f"mxfp8-gguf-{f}": ("@st-mxfp8-tiny", "m.gguf", ["--fallback", f]) for f in ("float32", "float16", "bfloat16")},
    # .hrry -> safetensors: what has no safetensors form (per-block, overlays) by a float fallback
    **{f"hrry-to-safetensors-{f}": ("@gguf", "t.safetensors", ["--fallback", f]) for f in ("float32", "float16", "bfloat16")},
    # --fallback with --convention: the convention for the MX pairs, the fallback for the rest
    **{f"hrry-to-safetensors-{c}-{f}": ("@gguf", "c.safetensors", ["--convention", c, "--fallback", f])
       for c in ("gpt-oss", "compressed-tensors", "mxfp8") for f in ("float32", "bfloat16")},
    "st-convention-mxfp8-fallback-float16": ("@st-gpt-oss-tiny", "c.safetensors", ["--convention", "mxfp8", "--fallback", "float16"]),
    # --fallback with --split-max-*: a new set of MX tensors without a GGML type, and of a lossy .hrry
    **{f"mxfp8-gguf-split-{f}": ("@st-mxfp8-tiny", "out/m.gguf", ["--fallback", f, "--split-max-tensors", "3"])
       for f in ("float32", "float16", "bfloat16")},
    "kquant-float16-export-split": ("@kquant-fallback-float16", "out/k.gguf", ["--fallback", "float16", "--split-max-tensors", "10"]),
    # --merge on a .hrry that records no split set: one file, as without it
    "gguf-export-merge-no-layout": ("@gguf", "m.gguf", ["--merge"]),
    # foreign to foreign, through Hurray
    "gguf-to-safetensors": ("fixtures/tiny-llama-kquant.gguf", "k.safetensors", ["--fallback", "bfloat16"]),
    "gguf-to-safetensors-f32": ("fixtures/tiny-llama.gguf", "t.safetensors", ["--fallback", "float32"]),
    "safetensors-to-gguf": ("fixtures/gpt-oss-tiny.safetensors", "g.gguf", []),
}


def cli(argv: list, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _made(case: str, root: Path, fixtures: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, Path, list[str]]:
    """``(SRC, DST, options)`` of a case, DST written by ``convert`` (its source made first)."""
    src, dst, opts = CHAIN[case]
    if src.startswith("@"):
        src_path = _made(src[1:], root, fixtures, capsys)[1]
    else:
        src_path = fixtures / src.split("/", 1)[1]
    d = root / case
    (d / "out").mkdir(parents=True, exist_ok=True)
    (d / "again").mkdir(exist_ok=True)
    if not (d / "done").exists():
        rc, out, err = cli(["convert", src_path, d / dst, *opts, "-q"], capsys)
        assert (rc, err) == (0, ""), (case, out, err)
        (d / "done").touch()
    return src_path, d / dst, opts


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("matrix")


@pytest.mark.parametrize("extra", PASSING, ids=lambda e: " ".join(e) or "plain")
@pytest.mark.parametrize("case", sorted(CHAIN))
def test_verify_with_the_options_of_the_conversion(case: str, extra: list[str], root: Path, fixtures_dir: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    src, dst, opts = _made(case, root, fixtures_dir, capsys)
    rc, out, err = cli(["verify", src, dst, *opts, *extra], capsys)
    assert (rc, err) == (0, ""), (case, out[-2000:], err)
    if "--json" in extra:
        (r,) = json.loads(out)
        assert r["ok"] and r["kind"] == "pair" and r["tensors"]
        lossy = [t for t in r["tensors"] if t["reported"]]
        # the tensors a lossy conversion changed are named, as its report named them; no others are lossy
        assert any(t["reported"].startswith("lossy as reported") for t in lossy) == (case in LOSSY), (case, lossy)
        assert all(t["bytes_equal"] is not False and t["values_equal"] is not False for t in r["tensors"] if not t["reported"])
    elif "--quiet" in extra:
        assert out.startswith("OK ") and out.count("\n") == 1
    else:
        assert out.splitlines()[-1].startswith("OK "), out[-1000:]


#: the cases whose conversion is lossy (some tensor's values change) and where their report says so
LOSSY = ["gguf-q41-requantize", "kquant-fallback-float16", "kquant-fallback-bfloat16", "kquant-float16-requantize",
         "gguf-to-safetensors", "hrry-to-safetensors-float16", "hrry-to-safetensors-bfloat16",
         *(f"hrry-to-safetensors-{c}-bfloat16" for c in ("gpt-oss", "compressed-tensors", "mxfp8"))]


@pytest.mark.parametrize("case", LOSSY)
def test_lossy_conversions_pass_as_reported_and_fail_without_the_options(
    case: str, root: Path, fixtures_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, dst, opts = _made(case, root, fixtures_dir, capsys)
    rc, out, _ = cli(["verify", src, dst, *opts, "--json"], capsys)
    (r,) = json.loads(out)
    lossy = [t for t in r["tensors"] if t["reported"].startswith("lossy as reported")]
    assert rc == 0 and lossy and any(t["values_equal"] is False and t["max_abs_diff"] for t in lossy)
    assert "lossy as reported (first: " in r["summary"]
    # the error the verdict names is the one the conversion's report measured
    rc, out, _ = cli(["convert", src, root / case / "again" / dst.name, *opts, "--json"], capsys)
    errors = {t["name"]: t["max_abs_error"] for t in json.loads(out)["tensors"] if t["status"] == "lossy"}
    # (GGUF -> safetensors: convert's report is the export's; the import's losses are verify's too)
    assert rc == 0 and errors and set(errors) <= {t["name"] for t in lossy}
    assert all(t["reported"].endswith(f"max abs error {errors[t['name']]:.6g}") for t in lossy if t["name"] in errors)
    rc, out, _ = cli(["verify", src, dst, "--json"], capsys)  # without the options: a plain exactness check
    (r,) = json.loads(out)
    assert rc == 1 and not r["ok"] and not any(t["reported"] for t in r["tensors"])


def test_a_lossy_file_against_other_lossy_options_fails(root: Path, fixtures_dir: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    src, dst, _ = _made("kquant-fallback-float16", root, fixtures_dir, capsys)
    rc, out, err = cli(["verify", src, dst, "--fallback", "bfloat16"], capsys)
    assert (rc, err) == (1, "")
    assert f"difference: {dst} is not what convert {src} {dst} --fallback bfloat16 writes: " in out
    assert out.splitlines()[-1].startswith("FAILED ")


def test_a_changed_lossy_tensor_fails(root: Path, fixtures_dir: Path, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    """One flipped bit in a float16 tensor the fallback wrote: not what the conversion writes."""
    from hurray_interop.core.hrry import HrryFile

    src, dst, opts = _made("kquant-fallback-float16", root, fixtures_dir, capsys)
    with HrryFile(dst) as hf:
        offset = hf.entry("blk.0.ffn_down.weight").data_offset  # its one buffer: the float16 values
    raw = bytearray(dst.read_bytes())
    raw[offset + 10] ^= 0x01
    bad = tmp_path / "bad.hrry"
    bad.write_bytes(raw)
    rc, out, err = cli(["verify", src, bad, *opts], capsys)
    assert (rc, err) == (1, ""), out[-500:]
    assert "is not what convert" in out and "blk.0.ffn_down.weight" in out


@pytest.mark.parametrize("opts, message", [
    (["--merge"], "--merge applies to GGUF output only"),
    (["--convention", "mxfp8"], "--convention applies to safetensors output only"),
])
def test_options_of_the_other_direction_are_usage_errors(opts: list[str], message: str, root: Path, fixtures_dir: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    src, dst, _ = _made("gguf", root, fixtures_dir, capsys)
    rc, out, err = cli(["verify", src, dst, *opts], capsys)
    assert (rc, out) == (2, "") and err == f"hurray-interop: error: {message}\n"


@pytest.mark.parametrize("opts", [["--fallback", "float16"], ["--merge"], ["--q4-1", "requantize"]])
def test_a_round_trip_takes_no_conversion_options(opts: list[str], fixtures_dir: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = cli(["verify", fixtures_dir / "tiny-llama.gguf", *opts], capsys)
    assert (rc, out) == (2, "") and err.startswith("hurray-interop: error: ") and err.count("\n") == 1
    assert "verify SRC DST" in err


@pytest.mark.parametrize("case", ["split-resplit", "kquant-fallback-float16", "st-convention-compressed-tensors"])
def test_the_same_in_a_batch(case: str, root: Path, fixtures_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--workers``: the options reach the worker processes; DST named as convert took it."""
    src, dst, opts = _made(case, root, fixtures_dir, capsys)
    rc, out, err = cli(["verify", "--workers", "2", src, dst, *opts], capsys)
    assert (rc, err) == (0, ""), out
    summary = "verified (lossy as reported)" if "float16" in case else "verified exact"
    assert out.startswith("OK ") and out.splitlines()[-1] == f"1 of 1 files {summary}"


def test_the_python_verb_takes_the_same_options(root: Path, fixtures_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import hurray_interop
    from hurray_interop.errors import UsageError

    src, dst, _ = _made("kquant-fallback-float16", root, fixtures_dir, capsys)
    r = hurray_interop.verify(src, dst, fallback="float16")
    assert r.ok and sum(1 for t in r.tensors if t.reported) == 2
    assert not hurray_interop.verify(src, dst).ok
    src, dst, _ = _made("split-merge", root, fixtures_dir, capsys)
    assert hurray_interop.verify(src, dst, merge=True).ok and not hurray_interop.verify(src, dst).ok
    with pytest.raises(UsageError, match="verify SRC DST --merge"):
        hurray_interop.verify(src, merge=True)

"""Command-line paths and messages (issue #20): options among the paths, what a refused run
and a dry run say, the zero-block note, sizes that agree between directions, output
directories, ``--skip-existing``, the truncated-.hrry message and ``dequantize`` of a GGUF tensor."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from fuzzing import assert_cli_contract, run_cli
from hurray_interop import convert


@pytest.fixture(scope="module")
def files(tmp_path_factory, fixtures_dir) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("inputs")
    out = {"gguf": d / "tiny.gguf", "kquant": d / "kquant.gguf"}
    shutil.copyfile(fixtures_dir / "tiny-llama.gguf", out["gguf"])
    shutil.copyfile(fixtures_dir / "tiny-llama-kquant.gguf", out["kquant"])
    out["hrry"] = d / "tiny.hrry"
    convert(out["gguf"], out["hrry"])
    out["khrry"] = d / "kquant-exact.hrry"
    convert(out["kquant"], out["khrry"], fallback="exact")
    return out


def _cli(*argv: object) -> tuple[int, str, str]:
    return run_cli([os.fspath(a) for a in argv])


# -- options anywhere among the paths -----------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["convert", "{src}", "--force", "{dst}"],
    ["convert", "--force", "{src}", "{dst}"],
    ["convert", "{src}", "{dst}", "--force"],
    ["convert", "{src}", "--to", "gguf", "--force", "{dst}"],
])
def test_options_may_come_between_the_paths(files, tmp_path, argv):
    dst = tmp_path / "back.gguf"
    dst.write_bytes(b"old")  # --force is needed: it must have been seen wherever it stood
    status, _, err = _cli(*(a.format(src=files["hrry"], dst=dst) for a in argv))
    assert status == 0, err
    assert dst.read_bytes() == files["gguf"].read_bytes()


def test_verify_options_may_come_between_the_files(files):
    status, out, err = _cli("verify", files["gguf"], "--quiet", files["hrry"])
    assert status == 0, err
    assert len(out.splitlines()) == 1 and out.startswith("OK")


def test_an_unknown_option_among_the_paths_is_still_a_usage_error(files, tmp_path):
    status, _, err = _cli("convert", files["hrry"], "--frobnicate", tmp_path / "x.gguf")
    assert status == 2 and "unrecognized arguments: --frobnicate" in err
    assert_cli_contract(status, err, output=tmp_path / "x.gguf")


# -- what a refused run, a dry run and an exact run say ------------------------------------------

HINT = "choose --fallback exact to store them exactly, larger, or --fallback float32|float16|bfloat16"


def test_a_refused_run_says_it_wrote_nothing_with_counts_and_the_hint(files, tmp_path):
    dst = tmp_path / "k.hrry"
    status, out, err = _cli("convert", files["kquant"], dst)
    assert status == 1 and not dst.exists()
    last = out.splitlines()[-1]
    assert last.startswith("refused: nothing written; ") and "converted" not in last
    assert "27 tensors (25 exact, 2 refused)" in last and HINT in last
    assert_cli_contract(status, err, output=dst)


def test_a_refused_run_in_json_carries_the_hint(files, tmp_path):
    status, out, _ = _cli("convert", files["kquant"], tmp_path / "k.hrry", "--json")
    assert status == 1
    assert HINT in json.loads(out)["hint"]


def test_a_dry_run_suggests_fallback_exact_per_refused_tensor_and_in_its_summary(files, tmp_path):
    status, out, _ = _cli("convert", files["kquant"], tmp_path / "k.hrry", "--dry-run")
    assert status == 1
    refused = [line for line in out.splitlines() if " refused " in line]
    assert {line.split()[1] for line in refused} == {"Q4_K", "Q6_K"}
    assert all(line.endswith("--fallback exact stores it exactly") for line in refused)
    assert out.splitlines()[-1].startswith("would refuse: ") and HINT in out.splitlines()[-1]


def test_inspect_plan_suggests_fallback_exact(files):
    from hurray_interop import inspect

    rows = {r["name"]: r for r in inspect(files["kquant"])["tensors"]}
    assert rows["blk.0.ffn_down.weight"]["reason"].endswith("--fallback exact stores it exactly")


def test_a_type_without_an_exact_form_is_not_told_to_use_fallback_exact():
    from hurray_interop.conversions import gguf_pass as P
    from hurray_interop.conversions.gguf import _import_tensor  # what carries out every import row
    from hurray_interop.formats import gguf as G

    q8k = G.ggml_type("Q8_K")  # refused, with no expanded form
    info = G.GGUFTensorInfo("t", q8k.id, (256,), 0, 0, q8k.block_bytes, 0, np.zeros(q8k.block_bytes, np.uint8))
    job = _import_tensor(info, P.DryRun(), fallback=None, q4_1="overlay")
    assert job.plan.status == "refused" and "--fallback exact stores it" not in job.plan.reason


def test_zero_block_substitutions_are_one_note_not_a_warning_per_row(files, tmp_path):
    status, out, _ = _cli("convert", files["gguf"], tmp_path / "t.hrry")
    assert status == 0
    assert "substituted" not in "".join(line for line in out.splitlines() if not line.startswith("note: "))
    notes = [line for line in out.splitlines() if "all-zero block" in line]
    assert len(notes) == 1 and notes[0].startswith("note: ") and "exact" in notes[0]
    status, out, _ = _cli("convert", files["gguf"], tmp_path / "u.hrry", "--json")
    counts = {t["name"]: t["substituted_blocks"] for t in json.loads(out)["tensors"]}
    assert sum(counts.values()) == int(notes[0].split()[1]) > 0


# -- sizes agree between the two directions ------------------------------------------------------


@pytest.mark.parametrize("key", ["hrry", "khrry"])
def test_bytes_of_one_file_agree_whichever_way_it_is_converted(files, tmp_path, key):
    src = files["kquant" if key == "khrry" else "gguf"]
    imp = convert(src, tmp_path / "a.hrry", fallback="exact" if key == "khrry" else None)
    exp = convert(files[key], tmp_path / "b.gguf")
    assert (exp.bytes_in, exp.bytes_out) == (imp.bytes_out, imp.bytes_in)
    assert {t.name: t.bytes_in for t in exp.tensors} == {t.name: t.bytes_out for t in imp.tensors}


@pytest.mark.parametrize("command", ["convert", "verify", "inspect"])
def test_help_among_the_paths_is_the_commands_whole_help(command, capsys):
    """Intermixed parsing hides the positionals during its first pass; help shown then still
    names them, as ``COMMAND --help`` does."""
    from hurray_interop import cli

    assert cli.main([command, "--help"]) == 0
    alone = capsys.readouterr().out
    assert cli.main([command, "some.gguf", "--help"]) == 0
    assert capsys.readouterr().out == alone
    assert ("PATH [PATH ...]" if command == "convert" else "FILE") in alone


# -- a truncated .hrry ----------------------------------------------------------------------------


@pytest.mark.parametrize("cut", [1, 4096])
def test_a_truncated_hrry_says_it_looks_truncated_with_file_offset_and_what_was_found(files, tmp_path, cut):
    raw = files["hrry"].read_bytes()
    bad = tmp_path / "cut.hrry"
    bad.write_bytes(raw[:-cut])
    found = raw[-cut - 4 : -cut]
    status, _, err = _cli("inspect", bad)
    assert status == 2
    assert_cli_contract(status, err)
    assert err.startswith(f"hurray-interop: error: {bad}: trailer_magic at offset {len(raw) - cut - 4}: ")
    assert f"trailer magic is {found!r}, expected b'HRRY'" in err and "looks truncated or incomplete" in err


# -- output directories ---------------------------------------------------------------------------

MISSING = "the output directory does not exist"


@pytest.fixture
def split_hrry(tmp_path_factory, fixtures_dir) -> Path:
    out = tmp_path_factory.mktemp("split") / "tiny-split.hrry"
    convert(fixtures_dir / "tiny-split-00001-of-00003.gguf", out)
    return out


@pytest.mark.parametrize("case", ["file", "split-set", "dir-slash", "through-hurray"])
def test_a_missing_output_directory_is_one_message_everywhere(files, split_hrry, tmp_path, monkeypatch, case):
    monkeypatch.chdir(tmp_path)
    src, dst, *more = {
        "file": (files["hrry"], "nodir/x.gguf"),
        "split-set": (split_hrry, "nodir/tiny-split-00001-of-00003.gguf"),
        "dir-slash": (files["hrry"], "nodir/"),
        "through-hurray": (files["gguf"], "nodir/x.safetensors", "--fallback", "float32"),
    }[case]
    status, _, err = _cli("convert", src, dst, *more)
    assert status == 2
    assert_cli_contract(status, err)
    assert err == f"hurray-interop: error: nodir: {MISSING}\n"
    assert os.listdir(tmp_path) == []


def test_out_dir_creates_only_its_last_directory_and_says_so(files, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    status, _, err = _cli("convert", "--to", "gguf", "--out-dir", "a/b", files["hrry"])
    assert status == 2 and err == f"hurray-interop: error: a: {MISSING} (--out-dir creates only its last directory)\n"
    assert os.listdir(tmp_path) == []
    status, out, err = _cli("convert", "--to", "gguf", "--out-dir", "a", files["hrry"])
    assert status == 0, err
    assert out.splitlines()[0] == "created the output directory a"
    assert (tmp_path / "a" / "tiny.gguf").read_bytes() == files["gguf"].read_bytes()
    status, out, err = _cli("convert", "--to", "gguf", "--out-dir", "a", files["hrry"], "--force")
    assert status == 0 and "created" not in out  # it exists now: nothing to say


def test_out_dir_with_a_missing_parent_fails_before_a_dry_run_too(files, tmp_path):
    status, _, err = _cli("convert", "--to", "gguf", "--out-dir", tmp_path / "a" / "b", files["hrry"], "--dry-run")
    assert status == 2 and MISSING in err


@pytest.mark.parametrize("spelling", ["slash", "existing"])
@pytest.mark.parametrize("src_key,to,want", [
    ("gguf", None, "tiny.hrry"), ("hrry", None, "tiny.gguf"), ("hrry", "safetensors", None),
])
def test_a_directory_destination_gets_the_sources_name_like_cp(files, tmp_path, spelling, src_key, to, want):
    d = tmp_path / "out"
    d.mkdir()
    dst = os.fspath(d) + ("/" if spelling == "slash" else "")
    argv = ["convert", files[src_key], dst] + (["--to", to] if to else [])
    status, out, err = _cli(*argv)
    if want is None:  # a refusal names the file it would have written
        assert status == 1 and f"{d / 'tiny.safetensors'}" in out.splitlines()[-1]
        return
    assert status == 0, err
    assert sorted(os.listdir(d)) == [want]
    back = files["gguf"] if want.endswith(".gguf") else None
    if back is not None:
        assert (d / want).read_bytes() == back.read_bytes()
    status, _, err = _cli(*argv)  # a second time: the file in the directory exists
    assert status == 2 and err == f"hurray-interop: error: {d / want}: exists (use --force to overwrite)\n"
    assert _cli(*argv, "--force")[0] == 0


def test_a_split_set_hrry_to_a_directory_writes_its_shards_there(split_hrry, fixtures_dir, tmp_path):
    d = tmp_path / "shards"
    d.mkdir()
    status, _, err = _cli("convert", split_hrry, d)
    assert status == 0, err
    names = sorted(os.listdir(d))
    assert names == [f"tiny-split-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    for n in names:
        assert (d / n).read_bytes() == (fixtures_dir / n).read_bytes()


def test_the_api_converts_into_a_directory_too(files, tmp_path):
    report = convert(files["hrry"], tmp_path)
    assert report.destination == os.path.join(tmp_path, "tiny.gguf")
    assert (tmp_path / "tiny.gguf").read_bytes() == files["gguf"].read_bytes()


# -- --skip-existing: resuming a batch ------------------------------------------------------------


@pytest.fixture
def two_sources(files, tmp_path) -> list[Path]:
    d = tmp_path / "src"
    d.mkdir()
    out = [d / "a.gguf", d / "b.gguf"]
    for p in out:
        shutil.copyfile(files["gguf"], p)
    return out


def test_skip_existing_resumes_an_interrupted_batch(two_sources, tmp_path):
    out = tmp_path / "out"
    assert _cli("convert", "--to", "hurray", "--out-dir", out, two_sources[0])[0] == 0  # "interrupted" after one
    first = (out / "a.hrry").stat().st_mtime_ns
    status, _, err = _cli("convert", "--to", "hurray", "--out-dir", out, *two_sources)
    assert status == 2 and "exist already" in err  # without the option: refused, before anything runs
    status, text, err = _cli("convert", "--to", "hurray", "--out-dir", out, *two_sources, "--skip-existing")
    assert status == 0, err
    lines = text.splitlines()
    assert lines[0] == f"SKIPPED {two_sources[0]} -> {out / 'a.hrry'}: exists, skipped"
    assert lines[1].startswith(f"OK      {two_sources[1]} -> {out / 'b.hrry'}")
    assert lines[-1] == "1 of 2 files converted (1 skipped)"
    assert (out / "a.hrry").stat().st_mtime_ns == first  # untouched
    assert (out / "b.hrry").read_bytes() == (out / "a.hrry").read_bytes()


def test_skip_existing_in_json_lines(two_sources, tmp_path):
    out = tmp_path / "out"
    assert _cli("convert", "--to", "hurray", "--out-dir", out, *two_sources)[0] == 0
    status, text, _ = _cli("convert", "--to", "hurray", "--out-dir", out, *two_sources, "--skip-existing", "--json")
    rows = [json.loads(line) for line in text.splitlines()]
    assert status == 0
    assert [(r["status"], r["exit_code"], r["output"]) for r in rows[:2]] == [
        ("skipped", 0, os.fspath(out / "a.hrry")), ("skipped", 0, os.fspath(out / "b.hrry"))]  # the path, as OK gives it
    assert rows[-1] == {"type": "summary", "files": 2, "counts": {"skipped": 2}, "exit_code": 0}


def test_skip_existing_counts_a_split_sets_shards(split_hrry, tmp_path):
    out = tmp_path / "out"
    assert _cli("convert", "--to", "gguf", "--out-dir", out, split_hrry)[0] == 0
    assert len(os.listdir(out)) == 3
    status, text, _ = _cli("convert", "--to", "gguf", "--out-dir", out, split_hrry, "--skip-existing")
    assert status == 0 and text.startswith("SKIPPED ") and "tiny-split-00001-of-00003.gguf: exists" in text


SHARDS = [f"tiny-split-0000{i}-of-00003.gguf" for i in (1, 2, 3)]


@pytest.mark.parametrize("deleted", [[1], [0, 2], [2]])
def test_skip_existing_refuses_a_partial_split_set(split_hrry, two_sources, tmp_path, deleted):
    """A set with a shard deleted is not an existing output: exit 2 naming the shards present
    and missing, nothing run (the other source is not converted, the shards stay)."""
    out = tmp_path / "out"
    assert _cli("convert", "--to", "gguf", "--out-dir", out, split_hrry)[0] == 0
    for i in deleted:
        os.unlink(out / SHARDS[i])
    kept = {n: (out / n).read_bytes() for n in os.listdir(out)}
    status, text, err = _cli("convert", "--to", "gguf", "--out-dir", out, split_hrry, two_sources[0], "--skip-existing")
    assert status == 2 and text == "", (status, text, err)
    assert_cli_contract(status, err)
    assert "incomplete split set" in err
    present, missing = err.split("shards present: ")[1].split("; missing: ")
    assert [os.path.basename(p) for p in present.split(", ")] == [n for i, n in enumerate(SHARDS) if i not in deleted]
    assert [os.path.basename(p) for p in missing.strip().split(", ")] == [SHARDS[i] for i in deleted]
    assert {n: (out / n).read_bytes() for n in os.listdir(out)} == kept  # nothing run, nothing written


def test_skip_existing_skips_a_complete_set_with_its_output_in_json(split_hrry, tmp_path):
    out = tmp_path / "out"
    assert _cli("convert", "--to", "gguf", "--out-dir", out, split_hrry)[0] == 0
    status, text, _ = _cli("convert", "--to", "gguf", "--out-dir", out, split_hrry, "--skip-existing", "--json")
    row = json.loads(text.splitlines()[0])
    assert status == 0 and row["status"] == "skipped" and row["output"] == os.fspath(out / "tiny-split.gguf")


@pytest.mark.parametrize("keep", [2, 3])
def test_skip_existing_with_split_max_counts_the_whole_new_set(files, tmp_path, keep):
    """With --split-max-* the set's size is known by its shards' names: all of them -> skipped,
    one missing -> exit 2 naming it."""
    out = tmp_path / "out"
    argv = ["convert", "--to", "gguf", "--out-dir", out, files["hrry"], "--split-max-tensors", "10"]
    assert _cli(*argv)[0] == 0
    shards = sorted(os.listdir(out))
    assert len(shards) == 3
    for n in shards[keep:]:
        os.unlink(out / n)
    status, text, err = _cli(*argv, "--skip-existing")
    if keep == 3:
        assert status == 0 and text.startswith("SKIPPED "), err
    else:
        assert status == 2 and err.rstrip().endswith(f"missing: {out / shards[2]}"), err


def test_skip_existing_from_python_refuses_shards_of_two_sets(files, tmp_path):
    """A complete set plus one shard of a set of another count under the prefix: not one
    complete output (UsageError naming the other set's missing shard), nothing run."""
    from hurray_interop.batch import convert_many
    from hurray_interop.errors import UsageError

    out = tmp_path / "out"
    opts = dict(dst_format="gguf", split_max_tensors=10)
    list(convert_many([files["hrry"]], out, **opts))
    (out / "tiny-00001-of-00002.gguf").write_bytes(b"stray")
    with pytest.raises(UsageError, match=r"missing: .*tiny-00002-of-00002\.gguf$"):
        convert_many([files["hrry"]], out, skip_existing=True, **opts)
    os.unlink(out / "tiny-00001-of-00002.gguf")
    (r,) = convert_many([files["hrry"]], out, skip_existing=True, **opts)
    assert r.status == "skipped" and r.output == os.path.join(out, "tiny.gguf")


def test_skip_existing_from_python(two_sources, tmp_path):
    from hurray_interop.batch import convert_many, summarize

    out = tmp_path / "out"
    list(convert_many(two_sources[:1], out, dst_format="hurray"))
    results = list(convert_many(two_sources, out, dst_format="hurray", skip_existing=True))
    assert [r.status for r in results] == ["skipped", "ok"]
    assert summarize(results).exit_code == 0


@pytest.mark.parametrize("argv,message", [
    (["--out-dir", "{out}", "--force", "--skip-existing"], "--skip-existing and --force exclude each other"),
    (["{dst}", "--skip-existing"], "--skip-existing resumes batches: give --out-dir DIR"),
])
def test_skip_existing_usage_errors(two_sources, tmp_path, argv, message):
    argv = [a.format(out=tmp_path / "out", dst=tmp_path / "x.hrry") for a in argv]
    status, _, err = _cli("convert", "--to", "hurray", two_sources[0], *argv)
    assert status == 2 and message in err
    assert_cli_contract(status, err)
    assert not (tmp_path / "out").exists() and not (tmp_path / "x.hrry").exists()


# -- dequantize: the same verb for a GGUF tensor ------------------------------------------------


@pytest.mark.parametrize("gguf_key,hrry_key", [("gguf", "hrry"), ("kquant", "khrry")])
def test_dequantize_takes_a_gguf_tensor_and_gives_what_the_hrry_gives(files, gguf_key, hrry_key):
    """Every tensor of a GGUF from ``open()`` dequantizes, bit for bit, to the values of its
    .hrry counterpart (the shared dequantizer), K-quants included; signed zeros too."""
    import hurray_interop

    with hurray_interop.open(files[gguf_key]) as g, hurray_interop.open(files[hrry_key]) as h:
        for info in g.tensors:
            got = hurray_interop.dequantize(g.tensor(info.name))
            want = hurray_interop.dequantize(h.tensor(info.name))
            assert got.dtype == np.float32 and got.shape == want.shape == info.shape, info.name
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), info.name


def test_dequantize_of_a_gguf_tensor_fills_out_and_checks_it(files):
    import hurray_interop
    from hurray_interop.errors import UsageError

    with hurray_interop.open(files["gguf"]) as g:
        t = g.tensor("blk.0.attn_k.weight")
        out = np.full(t.shape, np.nan, dtype=np.float32)
        assert hurray_interop.dequantize(t, out=out) is out and not np.isnan(out).any()
        with pytest.raises(UsageError, match="out must be a writeable C-contiguous float32 array"):
            hurray_interop.dequantize(t, out=np.empty(t.shape, dtype=np.float64))


def test_dequantize_of_a_split_sets_tensor(fixtures_dir):
    import hurray_interop
    from hurray_interop.conversions.gguf import reference_dequantizer

    with hurray_interop.open(fixtures_dir / "tiny-split-00002-of-00003.gguf") as m:
        last = m.tensors[-1]
        values = hurray_interop.dequantize(m.tensor(last.name))
        assert values.shape == last.shape
        decode = reference_dequantizer(last.ggml_type)
        want = last.array().astype(np.float32) if decode is None else decode(last.array())
        assert np.array_equal(values, np.asarray(want, dtype=np.float32).reshape(last.shape))


def test_dequantize_of_a_gguf_type_without_a_decoder_names_it():
    import hurray_interop
    from hurray_interop.errors import UnsupportedError
    from hurray_interop.formats import gguf as G

    q8k = G.ggml_type("Q8_K")
    info = G.GGUFTensorInfo("t", q8k.id, (256,), 0, 0, q8k.block_bytes, 0, np.zeros(q8k.block_bytes, np.uint8))
    with pytest.raises(UnsupportedError, match="tensor 't': gguf-py has no decoder for Q8_K"):
        hurray_interop.dequantize(info)


def test_dequantize_of_something_else_still_says_what_it_got():
    import hurray_interop
    from hurray_interop.errors import UsageError

    with pytest.raises(UsageError, match="expected a hurray_interop Tensor, got list"):
        hurray_interop.dequantize([1.0])


@pytest.mark.parametrize("name", ["gpt-oss-tiny", "ct-mxfp4-tiny", "mxfp8-tiny"])
def test_dequantize_takes_a_safetensors_tensor_and_gives_what_the_hrry_gives(fixtures_dir, tmp_path, name):
    """By the import's mapping: an MX pair's data tensor gives the values of the Hurray MXFP
    tensor made of the pair, a plain tensor those of its Hurray copy, bit for bit."""
    import hurray_interop
    from hurray_interop.errors import UnsupportedError, UsageError
    from hurray_interop.formats.safetensors import detect_pairs

    src, hrry = fixtures_dir / f"{name}.safetensors", tmp_path / f"{name}.hrry"
    convert(src, hrry)
    with hurray_interop.open(src) as s, hurray_interop.open(hrry) as h:
        pairs = detect_pairs(s)[0]
        hurray_name = {p.data.name: p.hurray_name for p in pairs}
        scales = {p.scale.name for p in pairs}
        checked = 0
        for e in s.entries:
            if e.name in scales:
                with pytest.raises(UsageError, match="is the scale tensor of the MX pair"):
                    hurray_interop.dequantize(s.tensor(e.name))
                continue
            try:
                got = hurray_interop.dequantize(s.tensor(e.name))
            except UnsupportedError as exc:  # bytes without values (BOOL, a lone E8M0 tensor)
                assert "travels as bytes" in str(exc)
                continue
            want = hurray_interop.dequantize(h.tensor(hurray_name.get(e.name, e.name)))
            assert got.shape == want.shape and np.array_equal(got.view(np.uint32), want.view(np.uint32)), e.name
            checked += 1
        assert checked > len(pairs) > 0


def test_a_batch_dry_runs_refused_line_carries_the_hint(files, tmp_path):
    status, out, _ = _cli("convert", "--to", "hurray", "--dry-run", "--out-dir", tmp_path / "o", files["kquant"])
    assert status == 1
    line = out.splitlines()[0]
    assert line.startswith("REFUSED ") and line.endswith(HINT + " to store them dequantized")

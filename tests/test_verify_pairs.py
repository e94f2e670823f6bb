"""``verify A B`` of two files that do not belong together: always a verdict (exit 1 and
the first difference), never a crash on a temporary file (issue #20).  CLI level."""

from __future__ import annotations

from pathlib import Path

import pytest

from hurray_interop.cli import main


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def made(fixtures_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """.hrry files of a split set, of one file and of an MX checkpoint, and GGUFs made from them."""
    d = tmp_path_factory.mktemp("pairs")
    files = {
        "set_hrry": d / "s.hrry", "one_hrry": d / "t.hrry", "merged": d / "merged.gguf",
        "gpt_hrry": d / "g.hrry", "two": d / "two" / "t-00001-of-00002.gguf",
    }
    (d / "two").mkdir()
    for argv in (
        ["convert", fixtures_dir / "tiny-split-00001-of-00003.gguf", files["set_hrry"], "-q"],
        ["convert", fixtures_dir / "tiny-llama.gguf", files["one_hrry"], "-q"],
        ["convert", files["set_hrry"], files["merged"], "--merge", "-q"],
        ["convert", files["set_hrry"], d / "two" / "t.gguf", "--split-max-tensors", "4", "-q"],
        ["convert", fixtures_dir / "gpt-oss-tiny.safetensors", files["gpt_hrry"], "-q"],
    ):
        assert main([str(a) for a in argv]) == 0, argv
    assert files["two"].exists()
    return files


def _verdict(rc: int, out: str, err: str) -> str:
    """The FAILED summary line of a pair that differs (exit 1, nothing on stderr)."""
    assert (rc, err) == (1, ""), (rc, err)
    assert "hurray-interop-verify-" not in out + err and "export.gguf" not in out + err
    last = out.strip().splitlines()[-1]
    assert last.startswith("FAILED "), last
    return last


def test_merged_gguf_against_the_set_hrry_it_came_from(made: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    line = _verdict(*run(["verify", made["merged"], made["set_hrry"]], capsys))
    assert f"{made['set_hrry']} exports to a set of 3 shards, {made['merged']} is one file" in line
    hinted = line.split(": verify ", 1)[1].rstrip(")").split()  # the hint is a command that passes
    assert hinted == [str(made["set_hrry"]), str(made["merged"]), "--merge"], line
    rc, out, _ = run(["verify", *hinted], capsys)
    assert rc == 0 and out.strip().splitlines()[-1].startswith("OK "), out
    import hurray_interop

    r = hurray_interop.verify(made["merged"], made["set_hrry"])  # only the layout differs: every tensor agrees
    assert not r.ok and len(r.tensors) == 8 and all(t.values_equal and t.bytes_equal for t in r.tensors), r.tensors


def test_other_model_gguf_against_a_set_hrry(made: dict[str, Path], fixtures_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(["verify", fixtures_dir / "tiny-llama.gguf", made["set_hrry"]], capsys)
    assert "tensors differ" in _verdict(rc, out, err)
    assert f"difference: {made['set_hrry']} exports to a set of 3 shards, {fixtures_dir / 'tiny-llama.gguf'} is one file" in out


def test_set_against_a_hrry_without_a_layout(made: dict[str, Path], fixtures_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(["verify", fixtures_dir / "tiny-split-00002-of-00003.gguf", made["one_hrry"]], capsys)
    _verdict(rc, out, err)
    assert f"difference: {made['one_hrry']} exports to one file" in out and "is a shard of a set of 3" in out
    # tensors of one name but another shape are a difference, not a crash
    assert "stored as Q8_0 [64, 300], not Q8_0 [32, 32]" in out


def test_sets_of_different_shard_counts(made: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    line = _verdict(*run(["verify", made["two"], made["set_hrry"]], capsys))
    assert "exports to a set of 3 shards" in line and "is a shard of a set of 2" in line


def test_safetensors_against_the_hrry_of_another_model(made: dict[str, Path], fixtures_dir: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(["verify", fixtures_dir / "mxfp8-tiny.safetensors", made["gpt_hrry"]], capsys)
    line = _verdict(rc, out, err)
    assert "tensors differ" in line
    rc, out, err = run(["verify", fixtures_dir / "mxfp8-tiny.safetensors", made["one_hrry"]], capsys)
    _verdict(rc, out, err)


@pytest.mark.parametrize("shard", ["00001", "00003"])
def test_the_set_against_its_own_hrry_still_passes(made: dict[str, Path], fixtures_dir: Path, shard: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(["verify", fixtures_dir / f"tiny-split-{shard}-of-00003.gguf", made["set_hrry"]], capsys)
    assert (rc, err) == (0, ""), out
    assert "files byte-identical, 8 tensors exact" in out.splitlines()[-1]

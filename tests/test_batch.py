"""Batch convert and verify (issue 14): a model collection in local processes and on a Dask cluster.

* a real ``distributed.LocalCluster`` (worker processes, loopback only) verifies a folder
  of generated GGUF files plus a truncated one: every good file OK, the bad one reported
  with its located error, exit status 2, results identical to the serial run and to
  ``verify_files`` (today's in-process verify);
* batch conversion on the cluster and with ``--workers 2`` writes files byte-identical to
  single :func:`hurray_interop.convert` calls; a refused file leaves the others
  written and itself absent; options pass through (``--fallback``);
* paths are checked before anything is submitted (duplicate outputs, missing inputs);
* JSON Lines output, Ctrl-C, executor failures, and the hint when the ``dask`` extra is missing.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import json
import logging
import os
import shutil
import sys
from pathlib import Path

import pytest

from fuzzing import run_cli
from gguf_factory import TensorDef, write_gguf_py
from hurray_interop import batch
from hurray_interop._convert import convert
from hurray_interop.errors import ConversionRefused, OutputExistsError, UsageError
from hurray_interop._verify import verify_files

GOOD = ["tiny-llama.gguf", "kv-types.gguf", "gen-a.gguf", "gen-b.gguf", "gen-c.gguf"]


@pytest.fixture(scope="module")
def collection(tmp_path_factory, fixtures_dir) -> Path:
    """A folder of good GGUF files (fixtures + generated), a K-quant one and a truncated one."""
    d = tmp_path_factory.mktemp("models")
    shutil.copyfile(fixtures_dir / "tiny-llama.gguf", d / "tiny-llama.gguf")
    shutil.copyfile(fixtures_dir / "kv-types.gguf", d / "kv-types.gguf")
    shutil.copyfile(fixtures_dir / "tiny-llama-kquant.gguf", d / "kquant.gguf")
    for seed, (name, types) in enumerate([("gen-a", ("Q8_0", "F16")), ("gen-b", ("Q4_0", "Q5_1")), ("gen-c", ("MXFP4", "BF16"))]):
        defs = [TensorDef(f"blk.0.w{i}", t, (4, 64)) for i, t in enumerate(types)]
        write_gguf_py(d / f"{name}.gguf", defs, seed=seed)
    data = (fixtures_dir / "tiny-llama.gguf").read_bytes()
    (d / "truncated.gguf").write_bytes(data[: len(data) - 1000])
    return d


@pytest.fixture(scope="module")
def cluster():
    """One real Dask cluster for the module: two worker processes on the loopback interface."""
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
        dashboard_address=None, silence_logs=logging.ERROR,
    ) as c, distributed.Client(c, set_as_default=False) as client:
        yield c, client


def comparable(results) -> list[dict]:
    """Results without their timings, in input order."""
    return sorted(({k: v for k, v in r.to_dict().items() if k != "seconds"} for r in results), key=lambda d: d["source"])


def files_in(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


# -- verify a collection ---------------------------------------------------------------------------


def test_cluster_verifies_a_collection_like_the_serial_run(collection, cluster):
    _, client = cluster
    paths = [os.fspath(collection / n) for n in GOOD + ["truncated.gguf"]]
    serial = list(batch.verify_many(paths))
    on_cluster = list(batch.verify_many(paths, executor=client.get_executor(pure=False)))

    assert comparable(on_cluster) == comparable(serial)
    by_name = {Path(r.source).name: r for r in on_cluster}
    assert sorted(by_name) == sorted(GOOD + ["truncated.gguf"])
    for name in GOOD:
        assert by_name[name].status == batch.OK, by_name[name].reason
    bad = by_name["truncated.gguf"]
    assert (bad.status, bad.exit_code) == (batch.BAD_INPUT, 2)
    assert bad.reason.startswith(os.fspath(collection / "truncated.gguf")) and "offset" in bad.reason
    assert batch.summarize(on_cluster).exit_code == 2

    # today's in-process verify (the oracle): the same verdict and the same error per file
    today = {Path(r.source).name: r for r in verify_files(paths, each=True)}
    assert {n: r.ok for n, r in today.items()} == {n: r.status == batch.OK for n, r in by_name.items()}
    assert today["truncated.gguf"].error == bad.reason


def test_cli_verify_on_the_scheduler(collection, cluster):
    c, _ = cluster
    paths = [os.fspath(collection / n) for n in GOOD + ["truncated.gguf"]]
    status, out, err = run_cli(["verify", "--scheduler", c.scheduler_address, *paths])
    assert status == 2
    lines = out.splitlines()
    assert len(lines) == len(GOOD) + 1  # one line per good file, then the summary
    assert sorted(line.split()[1].rstrip(":") for line in lines[:-1]) == sorted(paths[:-1])
    assert all(line.startswith("OK ") for line in lines[:-1])
    assert lines[-1] == f"{len(GOOD)} of {len(paths)} files verified exact (1 bad input)"
    assert err.splitlines() == [f"hurray-interop: error: {verify_files([paths[-1]])[0].error}"]


def test_cli_verify_with_local_workers_json_lines(collection):
    paths = [os.fspath(collection / n) for n in ["tiny-llama.gguf", "kquant.gguf", "truncated.gguf"]]
    status, out, err = run_cli(["verify", "--workers", "2", "--json", *paths])
    assert status == 2
    objects = [json.loads(line) for line in out.splitlines()]  # every line is one JSON object
    *files, summary = objects
    assert all(o["type"] == "file" for o in files) and summary["type"] == "summary"
    status_of = {Path(o["source"]).name: (o["status"], o["exit_code"]) for o in files}
    assert status_of == {
        "tiny-llama.gguf": ("ok", 0),
        "kquant.gguf": ("verification failed", 1),  # K-quants have no exact Hurray mapping
        "truncated.gguf": ("bad input", 2),
    }
    assert summary == {"type": "summary", "files": 3, "counts": {"ok": 1, "verification failed": 1, "bad input": 1}, "exit_code": 2}
    assert len(err.splitlines()) == 1 and "truncated.gguf" in err


def test_two_files_of_different_formats_are_one_pair_task(collection, tmp_path):
    src, hrry = collection / "kv-types.gguf", tmp_path / "kv.hrry"
    convert(src, hrry)
    ex = RecordingExecutor([None])
    (result,) = batch.verify_many([src, hrry], executor=ex)
    assert len(ex.submitted) == 1
    assert (result.source, result.other, result.status) == (os.fspath(src), os.fspath(hrry), batch.OK)
    assert result.reason == verify_files([os.fspath(src), os.fspath(hrry)])[0].summary_line().split(None, 1)[1]
    assert "pair" in result.reason
    results = list(batch.verify_many([src, hrry], pair=False, each=True))  # --each: two tasks, round trips
    assert [r.status for r in results] == [batch.OK, batch.BAD_INPUT]  # a .hrry alone has no source
    ex = RecordingExecutor()
    with pytest.raises(UsageError, match="--pair compares exactly two files, got 3"):  # before submission
        batch.verify_many([src, hrry, src], pair=True, executor=ex)
    assert ex.submitted == []


def test_quiet_prints_only_the_files_that_did_not_succeed(collection, tmp_path):
    sources = [os.fspath(collection / n) for n in ["kv-types.gguf", "kquant.gguf", "tiny-llama.gguf"]]
    status, out, err = run_cli(["convert", "-q", "--to", "hurray", "--out-dir", os.fspath(tmp_path), *sources])
    assert (status, err) == (1, "")
    assert len(out.splitlines()) == 1 and out.startswith(f"REFUSED {sources[1]}: ")


# -- convert a collection --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def singles(collection, tmp_path_factory) -> dict[str, dict[str, bytes]]:
    """The oracle: one single conversion per file, without and with --fallback float32."""
    out = {}
    for label, opts in [("plain", {}), ("fallback", {"fallback": "float32"})]:
        d = tmp_path_factory.mktemp(f"single-{label}")
        for name in GOOD + ["kquant.gguf"]:
            with contextlib.suppress(ConversionRefused):
                convert(collection / name, d / (Path(name).stem + ".hrry"), **opts)
        out[label] = files_in(d)
    assert "kquant.hrry" not in out["plain"] and "kquant.hrry" in out["fallback"]
    return out


@pytest.mark.parametrize("where", ["scheduler", "workers"])
def test_batch_convert_writes_what_single_conversions_write(collection, cluster, singles, tmp_path, where):
    c, _ = cluster
    run_on = ["--scheduler", c.scheduler_address] if where == "scheduler" else ["--workers", "2"]
    sources = [os.fspath(collection / n) for n in GOOD + ["kquant.gguf"]]

    status, out, err = run_cli(["convert", "--to", "hurray", "--out-dir", os.fspath(tmp_path / "plain"), *run_on, *sources])
    assert status == 1, err  # the refused K-quant file is the worst outcome
    assert files_in(tmp_path / "plain") == singles["plain"]  # the others written, it absent, no temporary files
    refused = [line for line in out.splitlines() if line.startswith("REFUSED")]
    assert len(refused) == 1 and "kquant.gguf" in refused[0] and "Q4_K" in refused[0]

    status, out, err = run_cli(
        ["convert", "--to", "hurray", "--fallback", "float32", "--out-dir", os.fspath(tmp_path / "fb"), *run_on, *sources]
    )
    assert status == 0, err
    assert files_in(tmp_path / "fb") == singles["fallback"]
    assert out.splitlines()[-1] == f"{len(sources)} of {len(sources)} files converted"


def test_convert_many_in_process_and_bad_files_do_not_stop_the_others(collection, singles, tmp_path):
    sources = [collection / "truncated.gguf", collection / "kquant.gguf", *(collection / n for n in GOOD)]
    results = list(batch.convert_many(sources, tmp_path / "out", dst_format="hurray"))
    assert [Path(r.source).name for r in results] == [p.name for p in sources]  # no executor: in order
    assert [r.status for r in results] == [batch.BAD_INPUT, batch.REFUSED] + [batch.OK] * len(GOOD)
    assert all(r.output == os.fspath(tmp_path / "out" / (Path(r.source).stem + ".hrry")) for r in results[2:])
    assert files_in(tmp_path / "out") == singles["plain"]


def test_dry_run_writes_nothing_and_reports_refusals(collection, tmp_path):
    sources = [os.fspath(collection / n) for n in ["tiny-llama.gguf", "kquant.gguf"]]
    status, out, _ = run_cli(["convert", "--to", "hurray", "--dry-run", "--out-dir", os.fspath(tmp_path / "o"), *sources])
    assert status == 1
    assert not (tmp_path / "o").exists()
    assert out.splitlines()[-1] == "1 of 2 files would convert (1 refused)"


# -- checks before submission ----------------------------------------------------------------------


class RecordingExecutor(cf.Executor):
    """Runs nothing: records submissions; futures stay pending unless ``outcomes`` settles them."""

    def __init__(self, outcomes=()):
        self.submitted: list = []
        self.futures: list[cf.Future] = []
        self.outcomes = list(outcomes)

    def submit(self, fn, /, *args, **kwargs):
        self.submitted.append((fn, args))
        fut: cf.Future = cf.Future()
        if self.outcomes:
            outcome = self.outcomes.pop(0)
            if isinstance(outcome, BaseException):
                fut.set_exception(outcome)
            else:
                fut.set_result(fn(*args))
        self.futures.append(fut)
        return fut


def test_duplicate_outputs_fail_before_submission(collection, tmp_path):
    other = tmp_path / "elsewhere"
    other.mkdir()
    shutil.copyfile(collection / "kv-types.gguf", other / "tiny-llama.gguf")
    sources = [collection / "kv-types.gguf", collection / "tiny-llama.gguf", other / "tiny-llama.gguf"]
    ex = RecordingExecutor()
    with pytest.raises(UsageError, match="would both be written to"):
        batch.convert_many(sources, tmp_path / "out", dst_format="hurray", executor=ex)
    assert ex.submitted == [] and not (tmp_path / "out").exists()

    status, out, err = run_cli(["convert", "--to", "hurray", "--out-dir", os.fspath(tmp_path / "out"), *map(os.fspath, sources)])
    assert (status, out) == (2, "")
    assert err == (
        f"hurray-interop: error: {collection / 'tiny-llama.gguf'} and {other / 'tiny-llama.gguf'} "
        f"would both be written to {tmp_path / 'out' / 'tiny-llama.hrry'}\n"
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["convert", "verify"])
def test_missing_input_fails_before_submission(collection, tmp_path, command):
    typo = tmp_path / "tiny-lama.gguf"
    sources = [collection / "tiny-llama.gguf", typo, tmp_path]
    ex = RecordingExecutor()
    with pytest.raises(UsageError) as info:
        if command == "convert":
            batch.convert_many(sources, tmp_path / "out", dst_format="hurray", executor=ex)
        else:
            batch.verify_many(sources, executor=ex)
    assert ex.submitted == []
    assert str(info.value) == f"{typo}: no such file (and 1 more)"

    extra = ["--to", "hurray", "--out-dir", os.fspath(tmp_path / "out")] if command == "convert" else []
    status, out, err = run_cli([command, "--workers", "2", *extra, *map(os.fspath, sources)])
    assert (status, out, err) == (2, "", f"hurray-interop: error: {typo}: no such file (and 1 more)\n")
    assert not (tmp_path / "out").exists()


# -- running: failures of the executor, Ctrl-C, the missing extra -----------------------------------


def test_an_executor_failure_is_that_files_result(collection):
    paths = [collection / "kv-types.gguf", collection / "tiny-llama.gguf"]
    ex = RecordingExecutor([RuntimeError("worker lost"), None])
    results = sorted(batch.verify_many(paths, executor=ex, each=True), key=lambda r: r.source)
    assert [(Path(r.source).name, r.status, r.exit_code) for r in results] == [
        ("kv-types.gguf", batch.ERROR, 2),
        ("tiny-llama.gguf", batch.OK, 0),
    ]
    assert results[0].reason == f"{paths[0]}: internal error: RuntimeError: worker lost"


def test_leaving_the_results_early_cancels_the_outstanding_tasks(collection):
    paths = [collection / n for n in GOOD]
    ex = RecordingExecutor([None])  # the first task finishes, the others never start
    results = batch.verify_many(paths, executor=ex, each=True)
    first = next(results)
    assert first.status == batch.OK
    results.close()
    assert len(ex.futures) == len(GOOD)
    assert [f.cancelled() for f in ex.futures] == [False] + [True] * (len(GOOD) - 1)


def test_ctrl_c_stops_the_batch_with_no_partial_output(collection, tmp_path, monkeypatch):
    real = batch.convert_file
    calls = []

    def convert_file(src, dst, options):
        calls.append(src)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(src, dst, options)

    monkeypatch.setattr(batch, "convert_file", convert_file)
    sources = [os.fspath(collection / n) for n in GOOD]
    status, out, err = run_cli(["convert", "--to", "hurray", "--out-dir", os.fspath(tmp_path), *sources])
    assert status == 130
    assert err == f"hurray-interop: interrupted after 1 of {len(GOOD)} files; the others cancelled, no partial output\n"
    assert len(calls) == 2  # nothing ran after the interruption
    assert os.listdir(tmp_path) == [Path(GOOD[0]).stem + ".hrry"]


def test_scheduler_without_the_dask_extra_exits_2_with_the_hint(collection, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "distributed", None)  # `import distributed` now fails
    path = os.fspath(collection / "kv-types.gguf")
    for argv in (["verify", "--scheduler", "tcp://127.0.0.1:8786", path],
                 ["convert", "--to", "hurray", "--out-dir", "unused", "--scheduler", "tcp://127.0.0.1:8786", path]):
        status, out, err = run_cli(argv)
        assert (status, out) == (2, "")
        assert len(err.splitlines()) == 1 and "install hurray-interop[dask]" in err
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "argv,message",
    [
        (["convert", "--workers", "2", "{src}", "x.hrry"], "--workers and --scheduler run batches: give --out-dir DIR"),
        (["convert", "{src}", "{src}", "x.hrry"], "convert takes SRC DST, not 3 paths"),
        (["convert", "--out-dir", "o", "{src}"], "--out-dir needs --to FORMAT"),
        (["verify", "--workers", "0", "{src}"], "--workers takes a positive number of processes, not 0"),
        (["verify", "--workers", "2", "--scheduler", "tcp://127.0.0.1:8786", "{src}"], "--workers and --scheduler exclude each other"),
        (["verify", "--scheduler", "nonsense", "{src}"], "--scheduler nonsense: missing port number"),
    ],
    ids=["workers-single", "three-paths", "no-to", "zero-workers", "both", "bad-address"],
)
def test_batch_usage_errors(collection, tmp_path, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    status, out, err = run_cli([a.format(src=collection / "kv-types.gguf") for a in argv])
    assert (status, out) == (2, "")
    assert err.startswith(f"hurray-interop: error: {message}") and len(err.splitlines()) == 1
    assert os.listdir(tmp_path) == []


# -- verify options and pairs in a batch, outputs checked before submission, the scheduler's timeout --


def test_verify_fallback_exact_runs_in_a_batch(collection):
    """K-quants round-trip exactly through their expanded forms (--fallback exact), in
    worker processes as in this process."""
    paths = [os.fspath(collection / n) for n in ["kquant.gguf", "tiny-llama.gguf"]]
    status, out, err = run_cli(["verify", "--workers", "2", "--fallback", "exact", "--json", *paths])
    assert (status, err) == (0, "")
    *files, summary = [json.loads(line) for line in out.splitlines()]
    serial = {r.source: r for r in verify_files(paths, fallback="exact")}
    assert {o["source"]: o["status"] for o in files} == {p: "ok" for p in paths}
    assert {o["source"]: o["reason"] for o in files} == {p: r.summary_line().split(None, 1)[1] for p, r in serial.items()}
    assert summary["counts"] == {"ok": 2}
    status, out, _ = run_cli(["verify", "--workers", "2", paths[0]])  # without it: no exact mapping
    assert status == 1 and out.startswith("FAILED")
    status, out, err = run_cli(["verify", "--workers", "2", "--fallback", "exact", "--pair", *paths])
    assert (status, out) == (2, "") and "--fallback: two GGUF files are not a conversion" in err


def test_two_files_of_one_format_are_two_round_trip_tasks(collection):
    """As in a single run: two GGUF files are two round trips (in parallel), a GGUF and a
    .hrry one pair; the decision is made before anything is submitted."""
    paths = [os.fspath(collection / n) for n in ["kv-types.gguf", "tiny-llama.gguf"]]
    ex = RecordingExecutor([None, None])
    results = sorted(batch.verify_many(paths, executor=ex), key=lambda r: r.source)
    assert [args[0] for _, args in ex.submitted] == [(p,) for p in paths]
    assert [(r.source, r.other, r.status) for r in results] == [(p, None, batch.OK) for p in paths]
    assert [r.reason for r in results] == [r.summary_line().split(None, 1)[1] for r in verify_files(paths)]


def test_existing_outputs_fail_before_submission(collection, fixtures_dir, tmp_path):
    sources = [os.fspath(collection / n) for n in ["kv-types.gguf", "tiny-llama.gguf", "gen-a.gguf"]]
    out = tmp_path / "out"
    out.mkdir()
    for stem in ("kv-types", "gen-a"):
        (out / f"{stem}.hrry").write_bytes(b"keep")
    ex = RecordingExecutor()
    with pytest.raises(OutputExistsError) as info:
        batch.convert_many(sources, out, dst_format="hurray", executor=ex)
    assert ex.submitted == []
    message = f"2 output(s) exist already (--force overwrites them): {out / 'kv-types.hrry'}, {out / 'gen-a.hrry'}"
    assert str(info.value) == message
    status, stdout, err = run_cli(["convert", "--to", "hurray", "--workers", "2", "--out-dir", os.fspath(out), *sources])
    assert (status, stdout, err) == (2, "", f"hurray-interop: error: {message}\n")
    assert files_in(out) == {"gen-a.hrry": b"keep", "kv-types.hrry": b"keep"}
    # --dry-run writes nothing, so nothing is in its way; --force overwrites
    assert run_cli(["convert", "--to", "hurray", "--dry-run", "--out-dir", os.fspath(out), *sources])[0] == 0
    status, _, err = run_cli(["convert", "--to", "hurray", "--force", "-q", "--out-dir", os.fspath(out), *sources])
    assert (status, err) == (0, "")
    assert sorted(files_in(out)) == ["gen-a.hrry", "kv-types.hrry", "tiny-llama.hrry"]
    # a new split set's shards count as outputs too
    convert(collection / "tiny-llama.gguf", tmp_path / "t.hrry")
    (tmp_path / "set").mkdir()
    (tmp_path / "set" / "t-00002-of-00003.gguf").write_bytes(b"keep")
    argv = ["convert", "--to", "gguf", "--split-max-tensors", "10", "--out-dir", os.fspath(tmp_path / "set"),
            os.fspath(tmp_path / "t.hrry")]
    status, _, err = run_cli(argv)
    assert status == 2 and err == (f"hurray-interop: error: 1 output(s) exist already (--force overwrites them): "
                                   f"{tmp_path / 'set' / 't-00002-of-00003.gguf'}\n")
    assert run_cli([*argv, "--force", "-q"])[0] == 0
    assert sorted(files_in(tmp_path / "set")) == [f"t-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    # a .hrry that recorded a split set: the shards it exports to are outputs too
    convert(fixtures_dir / "tiny-split-00001-of-00003.gguf", tmp_path / "tiny-split.hrry")
    back = tmp_path / "back"
    back.mkdir()
    (back / "tiny-split-00003-of-00003.gguf").write_bytes(b"keep")
    argv = ["convert", "--to", "gguf", "--out-dir", os.fspath(back), os.fspath(tmp_path / "tiny-split.hrry")]
    assert run_cli(argv)[2] == (f"hurray-interop: error: 1 output(s) exist already (--force overwrites them): "
                                f"{back / 'tiny-split-00003-of-00003.gguf'}\n")
    assert run_cli([*argv, "--merge", "-q"]) == (0, "", "")  # one merged file: the shards are not in its way
    status, _, err = run_cli(argv)
    assert status == 2 and f"2 output(s) exist already (--force overwrites them): {back / 'tiny-split.gguf'}, " in err
    assert run_cli([*argv, "-q", "--force"]) == (0, "", "")
    assert [files_in(back)[f"tiny-split-0000{i}-of-00003.gguf"] for i in (1, 2, 3)] == [
        (fixtures_dir / f"tiny-split-0000{i}-of-00003.gguf").read_bytes() for i in (1, 2, 3)]


class _Unreachable:
    """A stand-in for ``distributed.Client`` that fails as an unreachable scheduler does."""

    seen: list = []

    def __init__(self, address, **kwargs):
        self.seen.append(kwargs.get("timeout"))
        raise OSError(f"Timed out trying to connect to {address} after {kwargs.get('timeout')} s")


def test_unreachable_scheduler_is_one_line_within_the_connect_timeout(collection, monkeypatch):
    distributed = pytest.importorskip("distributed")
    path = os.fspath(collection / "kv-types.gguf")
    monkeypatch.setattr(distributed, "Client", _Unreachable)
    monkeypatch.setattr(_Unreachable, "seen", [])
    monkeypatch.delenv(batch.CONNECT_TIMEOUT_ENV, raising=False)
    status, out, err = run_cli(["verify", "--scheduler", "tcp://127.0.0.1:8786", path])
    assert (status, out) == (2, "") and _Unreachable.seen == [10.0]  # not Dask's 30 s
    assert err == ("hurray-interop: error: cannot reach the Dask scheduler at tcp://127.0.0.1:8786 (waited up to 10 s; "
                   "HURRAY_INTEROP_CONNECT_TIMEOUT sets the limit): Timed out trying to connect to "
                   "tcp://127.0.0.1:8786 after 10.0 s\n")
    monkeypatch.setenv(batch.CONNECT_TIMEOUT_ENV, "2.5")
    assert run_cli(["verify", "--scheduler", "tcp://127.0.0.1:8786", path])[0] == 2 and _Unreachable.seen[-1] == 2.5
    monkeypatch.setenv(batch.CONNECT_TIMEOUT_ENV, "soon")
    status, _, err = run_cli(["verify", "--scheduler", "tcp://127.0.0.1:8786", path])
    assert status == 2 and err == ("hurray-interop: error: HURRAY_INTEROP_CONNECT_TIMEOUT='soon': "
                                   "expected a positive number of seconds\n")


def test_unreachable_real_scheduler_fails_with_the_address(collection, monkeypatch):
    """A real Client against a port nobody listens on, with a short limit."""
    pytest.importorskip("distributed")
    import socket

    with socket.socket() as s:  # a free port, closed again
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv(batch.CONNECT_TIMEOUT_ENV, "0.5")
    status, out, err = run_cli(["verify", "--scheduler", f"tcp://127.0.0.1:{port}", os.fspath(collection / "kv-types.gguf")])
    assert (status, out) == (2, "") and len(err.splitlines()) == 1
    assert err.startswith(f"hurray-interop: error: cannot reach the Dask scheduler at tcp://127.0.0.1:{port} (waited up to 0.5 s")


def test_the_file_count_is_the_number_of_results(collection, fixtures_dir, tmp_path):
    """What the progress bar and the summary count: a split set (any of its shards given) is
    one source, a pair comparison one result."""
    shards = [fixtures_dir / f"tiny-split-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    plan = batch.plan_convert([*shards[1:], collection / "kv-types.gguf"], tmp_path / "o", dst_format="hurray")
    assert plan.files == 2 and len(list(plan.run())) == 2
    plan = batch.plan_verify([*shards, collection / "kv-types.gguf"])
    assert plan.files == 2 and [r.source for r in plan.run()] == [os.fspath(shards[0]), os.fspath(collection / "kv-types.gguf")]
    plan = batch.plan_verify([collection / "kv-types.gguf", tmp_path / "o" / "kv-types.hrry"])
    assert plan.files == 1 and [r.status for r in plan.run()] == [batch.OK]

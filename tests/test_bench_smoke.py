"""Smoke test of the benchmark script (bench/run.py) in its small mode.

It checks that the script runs end to end against cp and gguf-py and writes a
complete document; it does not judge the figures (a 16 MB model measures
start-up time, not throughput).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def test_small_benchmark_writes_every_row(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text("old\n<!-- analysis -->\nkept analysis text\n<!-- /analysis -->\n")
    p = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--size", "16MB", "--repeat", "1", "--vocab", "4096",
         "--dequant-mb", "2", "--out-dir", str(tmp_path / "out"), "--doc", str(doc)],
        capture_output=True, text=True, timeout=120,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    text = doc.read_text()
    for label in ("`cp` (physical limit)", "durable copy: `cp` + fsync", "gguf-py GGUFReader → GGUFWriter",
                  "ours: GGUF → Hurray", "ours: Hurray → GGUF", "gguf-py: dequantize every tensor",
                  "ours: `verify MODEL.gguf`, oracle ggml", "ours: `verify MODEL.gguf`, oracle gguf-py",
                  "ours: `verify MODEL.gguf X.hrry` (pair), oracle ggml",
                  "ours: `verify MODEL.gguf X.hrry` (pair), oracle gguf-py", "durable copy of the GGUF, just before `verify`",
                  "ours: `inspect` of a GGUF with a 4,096-token vocabulary",
                  "gguf-py: `GGUFReader` of the same 4,096-token file"):
        rows = [ln for ln in text.splitlines() if ln.startswith("|") and label in ln]
        assert len(rows) == 1, f"no single table row for {label!r}"
        assert re.search(r"\| \d+\.\d\d \|", rows[0]), f"row without a time: {rows[0]}"
    for t in ("Q4_0", "Q8_0", "Q4_1", "MXFP4"):
        row = next((ln for ln in text.splitlines() if ln.startswith(f"| {t} |")), None)
        assert row is not None, f"no dequantizer row for {t}"
        assert "| NO |" not in row, f"our dequantizer disagrees with gguf-py on {t}: {row}"
    # the round trip through Hurray gave the source back byte for byte (checked with cmp)
    assert "GGUF → Hurray → GGUF output identical to the source (cmp): **yes**" in text
    goals = text.split("## Targets", 1)[1].split("<!-- analysis -->", 1)[0]
    for goal in ("GGUF → Hurray wall time", "Hurray → GGUF wall time", "GGUF → Hurray peak RSS",
                 "Hurray → GGUF peak RSS", "GGUF → Hurray → GGUF output", "`verify` wall time",
                 "`verify` pair wall time", "`verify --oracle gguf-py` wall time", "`verify` peak RSS",
                 "dequantizer Q4_0", "dequantizer Q8_0", "dequantizer Q4_1", "dequantizer MXFP4",
                 "`inspect`, 4,096-token vocabulary"):
        row = next((ln for ln in goals.splitlines() if ln.startswith(f"| {goal} |")), None)
        assert row is not None and ("**pass**" in row or "**MISS**" in row), f"no verdict for {goal!r}"
    assert "| GGUF → Hurray → GGUF output | identical |" in goals
    for key in ("python", "numpy", "gguf-py", "hurray-interop", "cpu", "load average"):
        assert f"**{key}**" in text
    # which kernel the measured commands ran, as `hurray-interop --version` says
    assert re.search(r"^- \*\*kernel\*\*: (c|numpy) ", text, re.M)
    assert "kept analysis text" in text and "old" not in text.split("<!-- analysis -->")[0].splitlines()[0]
    # the generated files are removed
    assert not list((tmp_path / "out").glob("*.gguf")) and not list((tmp_path / "out").glob("*.hrry"))


def test_forms_benchmark_reads_the_forms_back(tmp_path: Path) -> None:
    """bench/forms.py on one-layer models: a table row per model (with its Q4_0 yardstick), the
    constructs read back from the .hrry, and --write replacing only its own label's subsection
    inside the hand-written part of the document."""
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# B\n\n<!-- analysis -->\nkept analysis text\n<!-- /analysis -->\n")
    p = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "forms.py"), "--models", "q4_1", "q4_k", "--layers", "1",
         "--repeat", "1", "--out-dir", str(tmp_path / "out"), "--write", "--label", "smoke", "--doc", str(doc)],
        capture_output=True, text=True, timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    text = doc.read_text()
    for model, how in (("q4_1", "default"), ("q4_k", "--fallback exact"), ("q4_0", "default")):
        row = next((ln for ln in text.splitlines() if ln.startswith(f"| {model} | ")
                    and ("| default |" in ln or "| --fallback exact |" in ln)), None)
        assert row is not None and f"| {how} |" in row and row.endswith("| yes |"), row
    # whatever construct the converter writes for Q4_1 (measured, not assumed), read back
    assert re.search(r"^\| q4_1 \| Q4_1 \| 100\.0 % \| `(overlay|partition)\[[^`]+\]`[^|]* \| \d+/9 \| 5\.000 \| "
                     r"\d+\.\d{3} \| \d+\.\d{3} \|", text, re.M)
    assert re.search(r"^\| q4_0 \| Q4_0 \| 100\.0 % \| `int4` \| 9/9 \| 4\.500 \| 4\.500 \|", text, re.M)
    assert text.index("## Compact exact forms") < text.index("### smoke") < text.index("<!-- /analysis -->")
    assert "kept analysis text" in text and not list((tmp_path / "out").glob("*.gguf"))
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import forms
    finally:
        sys.path.pop(0)
    forms.write_doc(doc, ["### other", "", "other table", ""], "other")
    forms.write_doc(doc, ["### smoke", "", "new table", ""], "smoke")
    text = doc.read_text()
    assert text.count("### smoke") == 1 and "new table" in text and "| q4_1 |" not in text
    assert "other table" in text and text.count("## Compact exact forms") == 1
    assert text.rstrip().endswith("<!-- /analysis -->")

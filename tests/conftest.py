"""Shared test fixtures.

``../shared/`` (beside the clone) holds the upstream spec, conformance vectors
and real GGUF samples.  CI has it; elsewhere the tests that need it skip and
say why.
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
FIXTURES = REPO / "fixtures"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.skip(f"../shared/ is not beside the clone (looked for {SHARED})")
    return SHARED


@pytest.fixture(scope="session")
def vectors_dir(shared_dir: Path) -> Path:
    d = shared_dir / "hurray-vectors"
    if not d.is_dir():
        pytest.skip(f"conformance vectors missing: {d}")
    return d


@pytest.fixture(scope="session")
def gguf_samples_dir(shared_dir: Path) -> Path:
    d = shared_dir / "gguf-samples"
    if not d.is_dir():
        pytest.skip(f"GGUF samples missing: {d}")
    return d


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture()
def no_ggml(monkeypatch: pytest.MonkeyPatch):
    """ggml's library switched off (``HURRAY_INTEROP_GGML=off``), its cached handles dropped
    before and after."""
    from hurray_interop.formats import gguf_ggml as ggml

    monkeypatch.setenv(ggml.ENV_VAR, "off")
    ggml._load.cache_clear()
    ggml._decoder.cache_clear()
    yield
    monkeypatch.undo()
    ggml._load.cache_clear()
    ggml._decoder.cache_clear()

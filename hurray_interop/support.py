"""The support matrix, generated from the tables in ``mappings/``.

The README embeds the output of :func:`support_matrix` between the markers
``<!-- support-matrix:start -->`` and ``<!-- support-matrix:end -->``;
``tests/test_support_matrix.py`` fails when the two drift apart.  Regenerate
with ``python -m hurray_interop.support --write README.md``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .tables import load_table

__all__ = ["support_matrix", "START", "END", "splice"]

START = "<!-- support-matrix:start -->"
END = "<!-- support-matrix:end -->"

_MAPPING_TEXT = {
    "plain": "{element}, bytes copied",
    "block": "per-block affine, {storage} SYMMETRIC, K={block_size}, f16 scales",
    "block_min": "exact minimum overlay: {storage} codes + uint2 minimum (per-block affine, K={block_size}); "
    "plain {storage} with int32 zero points when every minimum is an integer multiple of d",
    "mxfp": "MXFP {storage}, K={block_size}, e8m0 scales",
}


def _compact_text(m: dict, per_element: str) -> str:
    """The compact exact form of a ``gguf_hurray.toml`` row (docs/conversion-rules.md § 11)."""
    parts = ["uint4 low bits"] + ([f"{m['hi_plane']} 5th-bit plane"] if "hi_plane" in m else [])
    parts += ["broadcast f16 minimum"] if m["mapping"] == "block_min" else []
    return (f"compact exact overlay: {' + '.join(parts)} (per-block affine, K={m['block_size']}); "
            f"where a block needs it: {per_element}")


def _expanded_text(f: dict) -> str:
    """The exact expanded form of a ``gguf_expanded.toml`` row (``--fallback exact``)."""
    kind = f"overlay {f['storage']} + uint2 minimum" if f["overlay"] else f["storage"]
    if f.get("minimum") == "broadcast":  # the compact form (docs/conversion-rules.md § 11)
        base = "uint4 low bits + uint2 high-bit plane" if f.get("planes") else f["storage"]
        kind = f"compact overlay {base} + broadcast minimum (where a sub-block needs it: {kind})"
    zp = f", int32 zero point {f['zero_point']}" if "zero_point" in f else ""
    return f"`--fallback exact`: {kind}, K={f['sub_block']}, {f['scale'].replace('float', 'f')} scales{zp}"


def _ggml_rows() -> list[str]:
    ggml = load_table("ggml_types")
    mapping = load_table("gguf_hurray")
    expanded = load_table("gguf_expanded")["types"]
    rows = []
    for name, row in sorted(ggml.items(), key=lambda kv: int(kv[1]["id"])):
        if row["family"] == "removed":
            continue
        m = mapping["types"].get(name)
        if m is not None:
            text = _MAPPING_TEXT[m["mapping"]].format(**m)
            if m.get("compact"):
                text = _compact_text(m, text)
            back = "exact" if m["mapping"] == "plain" or m.get("export") == "inferred" else "exact (type recorded at import)"
            rows.append(f"| {name} | {int(row['id'])} | exact | {text} | {back} |")
        else:
            reason = mapping["refusals"]["by_type"].get(name) or mapping["refusals"]["by_family"].get(
                row["family"], mapping["refusals"]["by_family"]["default"]
            )
            fallback = name not in mapping["fallback"]["no_reference_dequantizer"]
            how = "refused; `--fallback` stores it dequantized" if fallback else "refused (no reference dequantizer, so no fallback)"
            if name in expanded:
                how = "refused; `--fallback exact` stores it exactly, `--fallback` float32/16 dequantized"
                if expanded[name].get("decoder") == "ggml":
                    how = ("refused; `--fallback exact` stores it exactly where ggml's own decoder loads "
                           "(`hurray-interop[ggml]`; the only decoder of the type), no float fallback")
                reason = f"{_expanded_text(expanded[name])}; by default: {reason}"
            back = "exact (from the record of `--fallback exact`)" if name in expanded else "—"
            rows.append(f"| {name} | {int(row['id'])} | {how} | {reason} | {back} |")
    return rows


def _mx_rows() -> list[str]:
    mx = load_table("mx_types")
    rows = []
    for name, row in mx["elements"].items():
        torch = row.get("torch") or "—"
        shift = int(row.get("ocp_exponent_shift", 0))
        note = f"scale byte shifted by {shift} (OCP implied 2^-6)" if shift else ""
        rows.append(f"| {row.get('ocp') or '(Hurray only)'} | {row['hurray']} | `{torch}` | `{row['ml_dtypes']}` | {note} |")
    return rows


def support_matrix() -> str:
    """Markdown tables of what converts to what, from ``mappings/``."""
    out = [
        "GGUF tensor types (`mappings/ggml_types.toml`, `mappings/gguf_hurray.toml`):",
        "",
        "| GGML type | id | GGUF → Hurray | Hurray form, or why not | back to GGUF |",
        "|---|---|---|---|---|",
        *_ggml_rows(),
        "",
        "OCP MX element types (`mappings/mx_types.toml`), all as Hurray MXFP (scheme 0x05) with any legal block size and axis:",
        "",
        "| OCP MX | Hurray storage | torch codes | ml_dtypes | note |",
        "|---|---|---|---|---|",
        *_mx_rows(),
    ]
    return "\n".join(out) + "\n"


def splice(text: str, matrix: str) -> str:
    """Replace the block between the markers in ``text`` by ``matrix``."""
    head, sep, rest = text.partition(START)
    if not sep or END not in rest:
        raise ValueError("support-matrix markers not found")
    _, _, tail = rest.partition(END)
    return f"{head}{START}\n{matrix}{END}{tail}"


if __name__ == "__main__":  # pragma: no cover - maintenance entry point
    if len(sys.argv) == 3 and sys.argv[1] == "--write":
        p = Path(sys.argv[2])
        p.write_text(splice(p.read_text(encoding="utf-8"), support_matrix()), encoding="utf-8")
    else:
        sys.stdout.write(support_matrix())

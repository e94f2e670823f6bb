"""The package's import graph, read from the source with ``ast`` (every import statement,
module-level or inside a function, TYPE_CHECKING blocks included): it has no cycle, and
its layers import only downwards --

    cli -> public verbs (__init__) -> _convert/_verify/_inspect/_edit -> plugins/ -> registry
        -> inspection, verification/ -> conversions/ -> formats/, dequant -> core/
        -> files/, parallel, errors, tables (generic, anyone may import them)

-- where the registry itself knows no format (it loads the built-in records of plugins/ by
name), and a format's record in plugins/ reaches its modules below the registry

-- and only cli.py prints or exits."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "hurray_interop"
ROOT = "hurray_interop"

#: the generic low layer anyone may import
LOW = {"errors", "tables", "parallel", "files", "kernels"}  # generic low layers (kernels: the generic compiled byte movers)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom, known: set[str]) -> set[str]:
    """The package modules one ``from ... import ...`` statement loads."""
    if node.level == 0:
        base = node.module or ""
    else:
        pkg = importer.split(".") if is_package else importer.split(".")[:-1]
        pkg = pkg[: len(pkg) - (node.level - 1)]
        base = ".".join(pkg + ([node.module] if node.module else []))
    if not (base == ROOT or base.startswith(ROOT + ".")):
        return set()
    out = set()
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        out.add(sub if sub in known else base)
    return out


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.ImportFrom):
                edges |= _resolve(name, path.name == "__init__.py", node, known)
            elif isinstance(node, ast.Import):
                edges |= {a.name for a in node.names if a.name in known}
        graph[name] = edges - {name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, or None (depth-first search with colours)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m) :] + [m]
            if m not in state and (found := visit(m)):
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return None


def _layer(mod: str) -> str:
    """The first component under the package: 'core', 'formats', 'dequant', 'cli', …"""
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


GRAPH = import_graph()

#: layers docs/design.md promises import (almost) nothing: the low layer is not granted to them
LEAVES = {"report", "support"}

#: what each layer may import (besides itself and the generic LOW layer)
ALLOWED = {
    "core": {"core"},
    "formats": {"core"},  # and no other format module, no conversion (checked below)
    "dequant": {"core"},
    "report": set(),  # plain data: imports nothing of the package, not even the low layer
    "support": {"tables"},  # the README matrix: the tables only
    "conversions": {"conversions", "formats", "core", "dequant", "report"},
    "inspection": {"conversions", "formats", "core", "report"},
    "verification": {"verification", "conversions", "formats", "core", "dequant"},
    "registry": {"conversions", "core"},  # only generic modules of them (checked below)
    "plugins": {"registry", "conversions", "formats", "core", "inspection", "verification"},
    "_convert": {"registry", "report"},
    "_verify": {"_convert", "registry", "verification", "report"},
    "_inspect": {"registry"},
    "_compare": {"registry", "_inspect", "verification"},
    "_edit": {"registry", "core"},
    "__init__": {"_convert", "_verify", "_inspect", "_compare", "_edit", "registry", "dequant", "core", "report",
                 "verification"},
    "batch": {"_convert", "_verify", "registry", "report", "verification"},
    "cli": {"__init__", "_convert", "_verify", "_inspect", "_compare", "_edit", "registry", "report", "batch"},
    "__main__": {"cli"},
    **{low: set(LOW) for low in LOW},
}


def test_the_graph_is_read_from_every_module() -> None:
    # the reader sees what we know is there: a function-level import and a relative one
    assert "hurray_interop.conversions.gguf" in GRAPH["hurray_interop.plugins.gguf"]  # inside a shim
    assert "hurray_interop.verification.common" in GRAPH["hurray_interop.verification.gguf"]
    assert GRAPH["hurray_interop.core.hrry"] >= {"hurray_interop.core.descriptor", "hurray_interop.files.binary"}
    # the GGUF reader reads through files.binary.Reader too (one bounds-checked cursor, one message)
    assert "hurray_interop.files.binary" in GRAPH["hurray_interop.formats.gguf"]


#: what the registry may import beside the low layer: the --fallback vocabulary
REGISTRY_IMPORTS = {f"{ROOT}.conversions.fallback"}


def test_the_registry_imports_no_format_specific_module() -> None:
    """The registry knows no format's internals: its imports are generic (the built-in
    formats' records are plugins/ modules it loads by name, each importing the registry)."""
    from hurray_interop import registry

    bad = {m for m in GRAPH[f"{ROOT}.registry"] if _layer(m) not in LOW and m not in REGISTRY_IMPORTS}
    assert not bad, f"the registry imports {sorted(bad)}"
    plugins = {m for m in GRAPH if _layer(m) == "plugins" and m != f"{ROOT}.plugins"}
    assert plugins == {f"{ROOT}.plugins.{name}" for name in registry.BUILTIN_FORMATS}
    assert all(f"{ROOT}.registry" in GRAPH[m] for m in plugins)  # each declares its own record
    # no module imports a plugin: the registry loads them, so the layering holds at run time too
    assert not {m for m, deps in GRAPH.items() for d in deps if d in plugins}


def test_detects_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_the_package_has_no_import_cycle() -> None:
    assert _cycle(GRAPH) is None, " -> ".join(_cycle(GRAPH) or [])


@pytest.mark.parametrize("mod", sorted(GRAPH))
def test_layers_import_only_downwards(mod: str) -> None:
    layer = _layer(mod)
    assert layer in ALLOWED, f"{mod}: new top-level module; give its layer a rule in ALLOWED"
    allowed = ALLOWED[layer] | (set() if layer in LEAVES else LOW) | {layer}
    if layer == "formats":
        # a format module imports the core and the low layer, never another format's module
        # (formats/gguf_split.py is GGUF's own: shard sets of the GGUF container)
        family = mod.split(".")[-1].split("_")[0]
        own = {m for m in GRAPH[mod] if m.startswith(f"{ROOT}.formats.") and m.split(".")[-1].split("_")[0] == family}
        bad = {m for m in GRAPH[mod] - own if _layer(m) not in LOW | {"core"} and m not in (mod, f"{ROOT}.formats")}
    else:
        bad = {m for m in GRAPH[mod] if _layer(m) not in allowed}
    assert not bad, f"{mod} imports {sorted(bad)} above or beside its layer"


#: the C functions of _kernel.c that move ggml's own block structs (Q5_0/Q5_1 ``qh``, the
#: K-quants' ``d``/``dmin``/scales, Q6_K's ``ql``/``qh``): called beside their users in
#: conversions/, never from the generic low layer
GGML_C_MOVERS = ("hk_q5_", "hk_q6k_", "hk_dsc_")


def _c_calls() -> dict[str, set[str]]:
    """Per module: the ``hk_*`` functions of the compiled library it calls (``….hk_name(``)."""
    calls: dict[str, set[str]] = {}
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr.startswith("hk_"):
                calls.setdefault(name, set()).add(node.func.attr)
    return calls


def test_the_low_layer_calls_no_ggml_specific_c_mover() -> None:
    calls = _c_calls()
    ggml = {m: {f for f in fs if f.startswith(GGML_C_MOVERS)} for m, fs in calls.items()}
    ggml = {m: fs for m, fs in ggml.items() if fs}
    assert set(ggml) == {f"{ROOT}.conversions.gguf_kernels"}, ggml
    assert ggml[f"{ROOT}.conversions.gguf_kernels"] == {
        "hk_q5_codes", "hk_q5_pack", "hk_dsc_scales", "hk_q6k_codes", "hk_q6k_pack", "hk_q5_k_plane", "hk_q5_k_join"}
    # the generic movers stay in the low layer, and every C function is called from one place
    assert calls[f"{ROOT}.kernels"] >= {"hk_split_to_pairs", "hk_move", "hk_unpack_runs", "hk_string_starts"}
    assert not calls[f"{ROOT}.kernels"] & calls[f"{ROOT}.conversions.gguf_kernels"]


def _calls_print_or_exit(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'":
            node.body = []  # a maintenance script's main block may print
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = ast.unparse(node.func)
            if f in ("print", "exit", "quit", "sys.exit", "os._exit") or f.startswith(("sys.stdout.", "sys.stderr.")):
                found.append(f"{f} (line {node.lineno})")
    return found


@pytest.mark.parametrize("mod", sorted(m for m in GRAPH if _layer(m) not in ("cli", "__main__")))
def test_only_the_cli_prints_or_exits(mod: str) -> None:
    path = _modules()[mod]
    assert not _calls_print_or_exit(ast.parse(path.read_text(encoding="utf-8")))


def test_print_check_sees_prints() -> None:
    assert _calls_print_or_exit(ast.parse("import sys\ndef f():\n    print(1)\n    sys.exit(2)\n")) == [
        "print (line 3)",
        "sys.exit (line 4)",
    ]
    assert not _calls_print_or_exit(ast.parse("if __name__ == '__main__':\n    print(1)\n"))

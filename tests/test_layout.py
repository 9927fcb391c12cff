"""The package layout's rules, read from the sources' import statements.

The measurement tools (phantora/probes/) run apart from every simulation: nothing that runs in one (the cost model,
the engine, the network model, the trace, live runs, the stubs) imports them. Framework-specific code lives in
phantora/frameworks/; the stubs import no framework, and only their stand-ins (stubs/phantora_stubs/standins/) name
one.
"""

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SIMULATION = ["phantora/costmodel", "phantora/engine", "phantora/net", "phantora/trace", "phantora/live", "stubs"]


def _module_name(path: Path) -> str:
    """The dotted name a source file imports as (stubs/phantora_stubs/x.py is phantora_stubs.x)."""
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[0] == "stubs":
        parts = parts[1:]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in one source file: `import a.b`, `from a import b` (as a.b
    too, b may be a module), relative imports resolved, and `importlib.import_module("a.b")` with a literal name."""
    tree = ast.parse(path.read_text(), str(path))
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.append((node.lineno, mod))
            out += [(node.lineno, f"{mod}.{a.name}") for a in node.names]
        elif (isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name))
              and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            out.append((node.lineno, node.args[0].value))
    return out


def _sources(folders: list[str]) -> list[Path]:
    files = [p for d in folders for p in sorted((ROOT / d).rglob("*.py"))]
    assert files, folders
    return files


def _violations(folders: list[str], forbidden: str) -> list[str]:
    return [f"{p.relative_to(ROOT)}:{line} imports {mod}" for p in _sources(folders)
            for line, mod in imported_modules(p) if mod == forbidden or mod.startswith(forbidden + ".")]


def test_nothing_that_runs_in_a_simulation_imports_the_probes():
    assert _violations(SIMULATION, "phantora.probes") == []


def test_the_stubs_import_no_framework_by_name():
    assert _violations(["stubs"], "phantora.frameworks") == []
    for framework in ("torchtitan", "megatron", "deepspeed", "transformer_engine"):
        assert _violations(["stubs"], framework) == []


def test_only_the_stand_ins_name_a_framework_in_the_stubs():
    """Framework knowledge in the stubs lives in standins/, one module per framework."""
    standins = ROOT / "stubs" / "phantora_stubs" / "standins"
    named = [f"{p.relative_to(ROOT)}" for p in _sources(["stubs"])
             if standins not in p.parents and any(f'"{fw}.' in p.read_text() or f"'{fw}." in p.read_text()
                                                    for fw in ("deepspeed", "megatron", "torchtitan"))]
    assert named == []


@pytest.mark.parametrize("source, expected", [
    ("from ..probes import calibrate\n", "phantora.probes.calibrate"),
    ("from ..probes.calibrate import x\n", "phantora.probes.calibrate"),
    ("import phantora.probes.powerprobe\n", "phantora.probes.powerprobe"),
    ("def f():\n    from phantora import probes\n", "phantora.probes"),
    ("import importlib\nimportlib.import_module('phantora.probes.sideprobe')\n", "phantora.probes.sideprobe"),
])
def test_the_scan_sees_every_form_of_import(tmp_path, monkeypatch, source, expected):
    """The scan itself: a probe import in each form, placed in a cost-model file, is found."""
    fake_root = tmp_path
    (fake_root / "phantora" / "costmodel").mkdir(parents=True)
    f = fake_root / "phantora" / "costmodel" / "model.py"
    f.write_text(source)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", fake_root)
    assert [m for _, m in imported_modules(f)].count(expected) >= 1
    assert _violations(["phantora/costmodel"], "phantora.probes")

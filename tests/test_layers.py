"""The folders are the layers, and imports run one way down them:

    recurlen/util/          errors, atomic files, fault hooks, progress, arguments, TensorBoard, tokenizers, hub
    recurlen/models/        the interface, layered state, the shared LM shell and layers, official-format I/O
    recurlen/models/<arch>/ one folder per architecture; never imports another architecture's folder
    recurlen/models/registry.py   the one module above the architecture folders that names them
    recurlen/diagnostics/   measurements through the state API
    callbacks/              (installed as recurlen.callbacks) the diagnostics run during validation
    recurlen/training/      data lanes, interventions, the LightningModule, trainer assembly, the run directory
    recurlen/evaluation/    the evaluation runner, held-out data, generation, the long-context tasks
    recurlen/commands/      the command line, the demo, the report, the preflight

A module may import its own folder or a lower layer, never a higher one. Every import counts, also one inside a
function or under TYPE_CHECKING: checked on the source (AST), so a lazy import cannot hide a dependency. And no
two modules import each other, directly or through others.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Folder prefix -> layer (higher imports lower). The most specific prefix wins; "recurlen.models.*" is any
# architecture folder. The package root (recurlen/__init__.py: lazy public shortcuts) is the top.
LAYERS = {
    "recurlen.util": 0,
    "recurlen.models": 1,
    "recurlen.models.*": 2,
    "recurlen.models.registry": 3,
    "recurlen.diagnostics": 4,
    "recurlen.callbacks": 5,
    "recurlen.training": 6,
    "recurlen.evaluation": 7,
    "recurlen.commands": 8,
    "recurlen": 9,
}


def _modules() -> dict[str, Path]:
    """Every module of the installed package by its import name (callbacks/ is recurlen.callbacks)."""
    out = {}
    for folder, package in ((ROOT / "recurlen", "recurlen"), (ROOT / "callbacks", "recurlen.callbacks")):
        for path in sorted(folder.rglob("*.py")):
            parts = [*package.split("."), *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def architecture_of(module: str) -> str | None:
    """recurlen.models.mamba2.scan -> 'mamba2'; None outside an architecture folder."""
    parts = module.split(".")
    if len(parts) >= 3 and parts[:2] == ["recurlen", "models"] and (ROOT / "recurlen" / "models" / parts[2]).is_dir():
        return parts[2]
    return None


def layer_of(module: str) -> int:
    if architecture_of(module):
        return LAYERS["recurlen.models.*"]
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in LAYERS:
            return LAYERS[prefix]
    raise AssertionError(f"module {module} is in no layer's folder; see LAYERS in {Path(__file__).name}")


def imports_of(module: str) -> set[str]:
    """The project modules that `module` imports (the deepest existing module an import names)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pkg import sub` imports pkg.sub when that is a module, else a name of pkg itself.
            names = [f"{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == \
                "import_module" and node.args and isinstance(node.args[0], ast.Constant):
            names = [node.args[0].value]
        for name in names:
            parts = str(name).split(".")
            for n in range(len(parts), 0, -1):
                if ".".join(parts[:n]) in MODULES:
                    found.add(".".join(parts[:n]))
                    break
    found.discard(module)
    return found


def test_every_module_has_a_layer():
    assert len(LAYERS) <= 10
    for module in MODULES:
        layer_of(module)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_run_down_the_layers(module):
    mine = layer_of(module)
    upward = sorted(dep for dep in imports_of(module) if layer_of(dep) > mine)
    assert not upward, f"{module} (layer {mine}) imports a higher layer: {upward}"
    arch = architecture_of(module)
    if arch:
        others = sorted(dep for dep in imports_of(module) if architecture_of(dep) not in (None, arch))
        assert not others, f"{module} imports another architecture's folder: {others}"
    elif layer_of(module) > LAYERS["recurlen.models.registry"]:
        named = sorted(dep for dep in imports_of(module) if architecture_of(dep))
        assert not named, f"{module} imports an architecture folder; only recurlen.models.registry may: {named}"


def test_no_import_cycle():
    graph = {module: imports_of(module) for module in MODULES}
    state: dict[str, int] = {}
    for start in sorted(graph):
        if state.get(start):
            continue
        stack, path, state[start] = [(start, iter(sorted(graph[start])))], [start], 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[node] = 2
                stack.pop()
                path.pop()
            elif state.get(child) == 1:
                cycle = path[path.index(child):] + [child]
                raise AssertionError(f"modules import each other: {' -> '.join(cycle)}")
            elif not state.get(child):
                state[child] = 1
                path.append(child)
                stack.append((child, iter(sorted(graph[child]))))


def test_the_checker_sees_a_lazy_upward_import(tmp_path, monkeypatch):
    """A deliberate break: the model core importing training inside a function is caught."""
    fake = tmp_path / "lm.py"
    fake.write_text("def f():\n    from recurlen.training.finetune import run_finetune\n    return run_finetune\n")
    monkeypatch.setitem(MODULES, "recurlen.models.state", fake)
    assert "recurlen.training.finetune" in imports_of("recurlen.models.state")
    with pytest.raises(AssertionError, match=r"recurlen.models.state \(layer 1\) imports a higher layer"):
        test_imports_run_down_the_layers("recurlen.models.state")


def test_the_checker_sees_one_architecture_importing_another(tmp_path, monkeypatch):
    fake = tmp_path / "model.py"
    fake.write_text("from recurlen.models.mamba2.scan import ssd_chunked\n")
    monkeypatch.setitem(MODULES, "recurlen.models.mamba1.model", fake)
    with pytest.raises(AssertionError, match="imports another architecture's folder"):
        test_imports_run_down_the_layers("recurlen.models.mamba1.model")


def test_the_checker_sees_a_cycle(tmp_path, monkeypatch):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("from recurlen.util import faults\n")
    b.write_text("import recurlen.util.errors\n")
    monkeypatch.setitem(MODULES, "recurlen.util.errors", a)
    monkeypatch.setitem(MODULES, "recurlen.util.faults", b)
    with pytest.raises(AssertionError, match="modules import each other"):
        test_no_import_cycle()

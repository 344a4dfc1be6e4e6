"""The import graph runs one way: core <- diagnostics <- training <- evaluation, tasks <- commands.

    core         the model families behind one interface, their state and scans, official-format I/O,
                 tokenizers, file writing, settings parsing and user errors
    diagnostics  measurements on a model through its state API (position-wise loss, state statistics,
                 EffRem, their plots) and the Lightning callbacks that run them during validation
    training     data lanes, interventions, the LightningModule, the train entry point, the run directory,
                 experiment composition
    evaluation   the checkpoint evaluation runner, the long-context tasks and their report sections, generation
    commands     the command line, the demo pipeline, the report

A module may import its own layer and the layers below, never one above; and no two packages import
each other. Every import counts, also one inside a function or under TYPE_CHECKING. Checked on the
source (AST), so a lazy import cannot hide a dependency.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("core", "diagnostics", "training", "evaluation", "commands")
# Most specific prefix wins; a module no prefix covers fails the test until it is given a layer here.
LAYER_OF = {
    "recurlen": "core",
    "recurlen.config": "core", "recurlen.state": "core", "recurlen.layered_state": "core", "recurlen.ssd": "core",
    "recurlen.kernels": "core", "recurlen.model": "core", "recurlen.checkpoint": "core", "recurlen.files": "core",
    "recurlen.tokenizer": "core", "recurlen.mamba1": "core", "recurlen.gla": "core",
    "recurlen.arch": "core", "recurlen.mamba2_architecture": "core", "recurlen.errors": "core",
    "recurlen.cli_args": "core", "recurlen.progress": "core",
    "recurlen.eval": "diagnostics", "callbacks": "diagnostics",
    "recurlen.interventions": "training", "recurlen.noise_refresh": "training", "recurlen.lit_module": "training",
    "recurlen.data": "training",
    "recurlen.train": "training", "recurlen.runs": "training", "recurlen.optim": "training",
    "recurlen.experiment": "training", "recurlen.resume": "training",
    "recurlen.generation": "evaluation", "recurlen.eval.runner": "evaluation", "recurlen.eval.heldout": "evaluation",
    "recurlen.tasks": "evaluation",
    "recurlen.cli": "commands", "recurlen.eval_cli": "commands", "recurlen.demo": "commands",
    "recurlen.report": "commands", "recurlen.plan": "commands",
}


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in ("recurlen", "callbacks"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def layer_of(module: str) -> str:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in LAYER_OF:
            return LAYER_OF[prefix]
    raise AssertionError(f"module {module} has no layer; add it to LAYER_OF in {Path(__file__).name}")


def imports_of(module: str) -> set[str]:
    """The project modules that `module` imports (the deepest existing module an import names)."""
    path = MODULES[module]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from pkg import sub` imports pkg.sub when that is a module, else a name of pkg itself.
            names = [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            parts = name.split(".")
            for n in range(len(parts), 0, -1):
                if ".".join(parts[:n]) in MODULES:
                    found.add(".".join(parts[:n]))
                    break
    found.discard(module)
    return found


# The architecture registry (recurlen.arch.architectures) imports each family lazily, and each family imports
# recurlen.arch's Architecture type: a registry, not a layering problem, until the type and the registry live
# in separate modules. Every other edge between packages counts.
REGISTRY_EDGES = {("recurlen.arch", "recurlen.gla"), ("recurlen.arch", "recurlen.mamba1"),
                  ("recurlen.arch", "recurlen.mamba2_architecture")}


def package_of(module: str) -> str:
    """recurlen.data.lanes -> recurlen.data; a top-level module of recurlen is its own node."""
    parts = module.split(".")
    if parts[0] == "callbacks":
        return "callbacks"
    return ".".join(parts[:2])


def test_every_module_has_a_layer():
    for module in MODULES:
        assert layer_of(module) in LAYERS


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_run_down_the_layers(module):
    mine = LAYERS.index(layer_of(module))
    upward = sorted(f"{dep} ({layer_of(dep)})" for dep in imports_of(module) if LAYERS.index(layer_of(dep)) > mine)
    assert not upward, f"{module} ({layer_of(module)}) imports a higher layer: {upward}"


def test_no_cycle_between_packages():
    graph: dict[str, set[str]] = {}
    for module in MODULES:
        src = package_of(module)
        graph.setdefault(src, set()).update(p for p in map(package_of, imports_of(module))
                                            if p != src and (src, p) not in REGISTRY_EDGES)
    # Iterative DFS: report the first cycle found with its path.
    state: dict[str, int] = {}
    for start in sorted(graph):
        if state.get(start):
            continue
        stack = [(start, iter(sorted(graph[start])))]
        path, state[start] = [start], 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[node] = 2
                stack.pop()
                path.pop()
            elif state.get(child) == 1:
                cycle = path[path.index(child):] + [child]
                raise AssertionError(f"packages import each other: {' -> '.join(cycle)}")
            elif not state.get(child):
                state[child] = 1
                path.append(child)
                stack.append((child, iter(sorted(graph.get(child, ())))))


def test_the_checker_sees_a_lazy_upward_import(tmp_path, monkeypatch):
    """A deliberate break: core importing training inside a function is caught."""
    fake = tmp_path / "model.py"
    fake.write_text("def f():\n    from recurlen.train import run_finetune\n    return run_finetune\n")
    monkeypatch.setitem(MODULES, "recurlen.model", fake)
    assert "recurlen.train" in imports_of("recurlen.model")
    with pytest.raises(AssertionError, match=r"recurlen.model \(core\) imports a higher layer: \['recurlen.train"):
        test_imports_run_down_the_layers("recurlen.model")

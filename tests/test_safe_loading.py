"""No unsafe loading: every torch.load of a file someone can hand over says weights_only=True, YAML is read safely,
nothing unpickles; resume goes through a checkpoint IO that forces weights_only. The scan reads the source."""

import ast
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
PACKAGES = [REPO / "recurlen", REPO / "callbacks", REPO / "benchmarks"]


def _calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else ""
            yield node, owner, name


def violations(source: str, where: str) -> list[str]:
    found = []
    for node, owner, name in _calls(ast.parse(source)):
        kw = {k.arg: k.value for k in node.keywords}
        at = f"{where}:{node.lineno}"
        if owner == "torch" and name == "load":
            value = kw.get("weights_only")
            if not (isinstance(value, ast.Constant) and value.value is True):
                found.append(f"{at}: torch.load without weights_only=True")
        if owner in ("pickle", "cPickle", "dill", "marshal") and name in ("load", "loads", "Unpickler"):
            found.append(f"{at}: {owner}.{name}")
        if owner == "yaml" and name in ("load", "load_all", "unsafe_load", "full_load", "full_load_all"):
            loader = kw.get("Loader")
            if name.startswith(("unsafe", "full")) or not (isinstance(loader, ast.Attribute)
                                                           and "Safe" in loader.attr):
                found.append(f"{at}: yaml.{name} without a safe loader")
        if owner in ("np", "numpy") and name == "load":
            value = kw.get("allow_pickle")
            if value is not None and not (isinstance(value, ast.Constant) and value.value is False):
                found.append(f"{at}: numpy.load with allow_pickle")
        if name in ("fit", "validate", "test", "predict") and "ckpt_path" in kw:
            value = kw.get("weights_only")
            if not (isinstance(value, ast.Constant) and value.value is True):
                found.append(f"{at}: Trainer.{name}(ckpt_path=...) without weights_only=True")
    return found


def test_the_package_has_no_unsafe_loading():
    found = []
    for root in PACKAGES:
        for path in sorted(root.rglob("*.py")):
            found += violations(path.read_text(), str(path.relative_to(REPO)))
    assert found == []


@pytest.mark.parametrize("bad", [
    "import torch\ntorch.load(p)",
    "import torch\ntorch.load(p, weights_only=False)",
    "import pickle\npickle.loads(b)",
    "import yaml\nyaml.load(s)",
    "import yaml\nyaml.load(s, Loader=yaml.FullLoader)",
    "import numpy as np\nnp.load(p, allow_pickle=True)",
    "trainer.fit(m, ckpt_path=c)",
])
def test_the_scan_catches_each_kind(bad):
    assert violations(bad, "x.py")  # a scan that cannot fail proves nothing


def test_resume_loads_checkpoints_with_weights_only(tmp_path):
    """A checkpoint carrying a pickled object (code on load) is refused by the run checkpoint IO."""
    from recurlen.training.finetune import AtomicCheckpointIO

    class Planted:
        def __reduce__(self):
            return (print, ("this would run on load",))

    path = tmp_path / "planted.ckpt"
    torch.save({"state_dict": {}, "x": Planted()}, path)
    with pytest.raises(Exception, match="Weights only load failed|Unsupported global"):
        AtomicCheckpointIO().load_checkpoint(path, weights_only=False)  # forced safe whatever the caller asks

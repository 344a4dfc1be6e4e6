"""The wheel holds one top-level package, recurlen (callbacks and experiments inside it), and a non-editable
install finds its experiments without a source checkout or a particular directory."""

import os
import re
import shutil
import subprocess
import sys
import zipfile
from email import message_from_string
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml

from recurlen.models import registry

REPO = Path(__file__).resolve().parents[1]
PIP = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]


def _copy_checkout(root: Path) -> Path:
    """A copy of the checkout to build from (a build/ left in the checkout by an earlier build would otherwise
    bring files that no longer exist into it)."""
    source = root / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "runs", "*.egg-info", "__pycache__", ".cache", ".*_cache", "lightning_logs"))
    return source


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel `pip wheel` builds from a copy of the checkout."""
    root = tmp_path_factory.mktemp("wheel")
    source = _copy_checkout(root)
    subprocess.run([*PIP, "wheel", str(source), "--no-deps", "--no-build-isolation", "-w", str(root / "wheels")],
                   check=True, cwd=root, capture_output=True)
    (found,) = (root / "wheels").glob("recurlen-*.whl")
    return found


def test_wheel_holds_only_the_recurlen_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"recurlen"}, sorted(tops)
    info = next(t for t in tops if t.endswith(".dist-info"))
    assert zipfile.ZipFile(wheel).read(f"{info}/top_level.txt").decode().split() == ["recurlen"]

    def files(folder: str, pattern: str) -> set[str]:
        return {p.relative_to(REPO / folder).as_posix() for p in (REPO / folder).rglob(pattern)
                if "__pycache__" not in p.parts}

    def shipped(prefix: str, suffix: str) -> set[str]:
        return {n[len(prefix):] for n in names if n.startswith(prefix) and n.endswith(suffix)}

    # The checkout's callbacks/ is recurlen.callbacks; recurlen's modules are the checkout's, no more, no fewer.
    assert shipped("recurlen/callbacks/", ".py") == files("callbacks", "*.py")
    assert "__init__.py" in shipped("recurlen/callbacks/", ".py")
    assert {n for n in shipped("recurlen/", ".py") if not n.startswith("callbacks/")} == files("recurlen", "*.py")
    # Every experiment file, in its folder, inside the package.
    assert shipped("recurlen/experiments/", ".yaml") == files("experiments", "*.yaml")
    assert "finetune.yaml" in shipped("recurlen/experiments/", ".yaml")


@pytest.mark.slow
def test_installed_wheel_finds_its_experiments(tmp_path, wheel):
    target = tmp_path / "site"
    subprocess.run([*PIP, "install", "--no-deps", "--target", str(target), str(wheel)], check=True, cwd=tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "RECURLEN_EXPERIMENTS"}
    env["PYTHONPATH"] = str(target)  # ahead of the editable install of this checkout
    code = ("import recurlen; from recurlen.training.experiments.compose import experiments_dir, load_experiment; "
            "print(recurlen.__file__); print(experiments_dir()); "
            "print(load_experiment(['experiment=demo-posttrain', 'intervention=state_passing'])[0].optim.lr)")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, check=True, capture_output=True,
                         text=True).stdout.split()
    assert out[0] == str(target / "recurlen" / "__init__.py")
    assert out[1] == str(target / "recurlen" / "experiments")
    assert float(out[2]) == 5e-4  # demo-posttrain's own value, on top of what it inherits


def _pyproject(key: str) -> str:
    return re.search(rf'^{key} = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M).group(1)


def test_version_is_the_package_metadata_everywhere(tmp_path):
    import recurlen

    expected = version("recurlen")
    assert expected == _pyproject("version") and recurlen.__version__ == expected
    script = Path(sys.executable).parent / "recurlen"
    for command in ([str(script), "--version"], [sys.executable, "-m", "recurlen", "--version"],
                    [sys.executable, "-m", "recurlen", "-V"]):
        done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True)
        assert (done.returncode, done.stdout, done.stderr) == (0, f"recurlen {expected}\n", ""), command


@pytest.fixture(scope="module")
def metadata(tmp_path_factory) -> tuple[str, str]:
    """(METADATA, what the build backend printed) for a copy of the checkout, as a build front end asks for it."""
    root = tmp_path_factory.mktemp("metadata")
    source = _copy_checkout(root)
    code = (f"from setuptools import build_meta; print(build_meta.prepare_metadata_for_build_wheel({str(root)!r}))")
    done = subprocess.run([sys.executable, "-W", "default", "-c", code], cwd=source, capture_output=True, text=True,
                          check=True)
    info = done.stdout.strip().splitlines()[-1]
    return (root / info / "METADATA").read_text(), done.stdout + done.stderr


def test_metadata_has_the_license_and_every_architecture_without_a_deprecation_warning(metadata):
    text, printed = metadata
    assert "Deprecation" not in printed and "deprecated" not in printed, printed
    meta = message_from_string(text)
    assert meta["License-Expression"] == "Apache-2.0" and meta.get_all("License-File") == ["LICENSE"]
    assert meta["Requires-Python"] == ">=3.10" and meta["Version"] == version("recurlen")
    own = [a.title for a in registry.architectures().values() if a.model_cls.__module__.startswith("recurlen.")]
    assert len(own) >= 4 and [t for t in own if t not in meta["Summary"]] == [], meta["Summary"]
    assert (REPO / "LICENSE").read_text().split()[:4] == ["Apache", "License", "Version", "2.0,"]


def test_citation_names_this_version_and_the_paper():
    cff = yaml.safe_load((REPO / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0" and cff["type"] == "software"
    assert cff["version"] == version("recurlen") and cff["license"] == _pyproject("license")
    paper = cff["preferred-citation"]
    assert paper["title"] == "Understanding and Improving Length Generalization in Recurrent Models"
    assert [a["family-names"] for a in paper["authors"]] == ["Buitrago Ruiz", "Gu"] and paper["year"] == 2025
    assert paper["doi"] == "10.48550/arXiv.2507.02782" and "2507.02782" in (REPO / "README.md").read_text()
    assert "ICML 2025" in paper["conference"]["name"]


def test_no_page_tells_the_user_to_install_a_dependency_by_hand():
    """A package in pyproject.toml's dependencies comes with recurlen: a doc that says `pip install` it sends a new
    user on a step that does nothing (zstandard, for .zst sources, was such a line)."""
    import tomllib

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].lower().replace("_", "-") for d in deps}
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    told = [(page.name, line.strip()) for page in pages for line in page.read_text().splitlines()
            for m in re.finditer(r"pip install ([A-Za-z0-9_.\-]+)", line)
            if m.group(1).lower().replace("_", "-") in names]
    assert not told, told

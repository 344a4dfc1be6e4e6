"""What pyproject.toml cannot say: the packages, and experiments/ shipped inside the package.

- The repository's top-level callbacks/ folder is installed as recurlen.callbacks: the wheel holds one top-level
  package, recurlen, and never a generic `callbacks` that could clash with another distribution's.
- experiments/ ships inside the package (recurlen/experiments in a wheel), so that an installed recurlen finds
  its experiment files without a source checkout.
Everything else is in pyproject.toml."""

import shutil
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py


class BuildPyWithExperiments(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads the checkout's experiments/ in place
        source = Path(__file__).resolve().parent / "experiments"
        target = Path(self.build_lib) / "recurlen" / "experiments"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(source, target, ignore=lambda _dir, names: [n for n in names if not n.endswith(".yaml")
                                                                    and not (Path(_dir) / n).is_dir()])


setup(
    packages=[*find_packages(include=["recurlen", "recurlen.*"]), "recurlen.callbacks"],
    package_dir={"recurlen.callbacks": "callbacks"},
    cmdclass={"build_py": BuildPyWithExperiments},
)

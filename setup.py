"""Ships experiments/ inside the package (recurlen/experiments in a wheel), so that an installed recurlen
finds its experiment files without a source checkout; everything else is in pyproject.toml."""

import shutil
from pathlib import Path

from setuptools import setup
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


setup(cmdclass={"build_py": BuildPyWithExperiments})

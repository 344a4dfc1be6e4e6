"""recurlen: post-train recurrent language models to generalize far beyond their training length.

The package root stays light: `import recurlen.util.errors` does not build a model. The names below are
shortcuts to the default architecture (Mamba-2) through the registry, which knows every architecture.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Mamba2Config", "Mamba2LM", "RecurrentState", "preset"]


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from recurlen.util.version import installed_version

        return installed_version()
    if name in __all__:
        from recurlen.models import registry

        arch = registry.get(registry.DEFAULT)
        return {"Mamba2Config": arch.config_cls, "Mamba2LM": arch.model_cls, "RecurrentState": arch.state_cls,
                "preset": arch.preset}[name]
    raise AttributeError(f"module 'recurlen' has no attribute {name!r}")

"""cerebellar-norse: a low-latency cerebellar spiking neural network for market ticks."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from .config import Config, load_config
    from .neurons.network import CerebellarNetwork

__all__ = ["CerebellarNetwork", "Config", "__version__", "load_config"]


def __getattr__(name: str) -> Any:
    # Lazy: importing the package (e.g. for the CLI's config checks) must not load torch.
    if name == "CerebellarNetwork":
        from .neurons.network import CerebellarNetwork

        return CerebellarNetwork
    if name in ("Config", "load_config"):
        from . import config

        return getattr(config, name)
    raise AttributeError(name)

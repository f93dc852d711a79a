"""The differentially private operators of tops: pure algorithms, no I/O, no asyncio."""

from operators.config import SMOOTHERS, ConfigError, ToPSConfig
from operators.noise import Domain, KeyedGenerator, new_key
from operators.topl import ToPL, ToPLConfig, choose_threshold
from operators.tops import ToPS

__all__ = [
    "SMOOTHERS",
    "ConfigError",
    "Domain",
    "KeyedGenerator",
    "ToPL",
    "ToPLConfig",
    "ToPS",
    "ToPSConfig",
    "choose_threshold",
    "new_key",
]

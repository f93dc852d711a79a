"""The differentially private operators of tops: pure algorithms, no I/O, no asyncio."""

from operators.config import SMOOTHERS, ConfigError, ToPSConfig
from operators.noise import Domain, KeyedGenerator, new_key
from operators.tops import ToPS

__all__ = ["SMOOTHERS", "ConfigError", "Domain", "KeyedGenerator", "ToPS", "ToPSConfig", "new_key"]

"""transformer_engine.common: the recipes."""

from . import recipe  # noqa: F401

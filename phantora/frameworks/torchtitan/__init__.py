"""TorchTitan (release 0.3.0), run unmodified under `phantora run -- python -m torchtitan.train ...`.

- `command.py`: `torchtitan_argv`, the command line of a simulated TorchTitan run;
- `llama2.py`: configs for Llama 2 7B/13B/70B, which TorchTitan 0.3.0 no longer ships
  (`--module phantora.frameworks.torchtitan.llama2`);
- `gpt_oss.py`: gpt-oss 20B with FlexAttention (TorchTitan's own config needs FlashAttention 3's varlen kernels)
  (`--module phantora.frameworks.torchtitan.gpt_oss`);
- `recipe_2024.py`: configs with TorchTitan's 2024 recipe, for its published 2024 measurements
  (`--module phantora.frameworks.torchtitan.recipe_2024`);
- `float8_tensorwise.py`: tensorwise Float8 with FSDP Float8 all-gathers and precomputed scales, as the published
  Float8 measurements ran it (`--module phantora.frameworks.torchtitan.float8_tensorwise`; the 2024 recipe's
  `<model>_float8` configs use it);
- `assets.py`: a local tokenizer and dataset (`phantora assets torchtitan`), so TorchTitan needs no hub access.

TorchTitan imports the config modules by their module path inside each simulated rank; this package and its
parent import nothing heavy (no torch, no TorchTitan) so that they load there and on the host alike.
The registry (phantora/frameworks/__init__.py) reaches it as `framework_module("torchtitan")`.
"""

from __future__ import annotations

from .command import AC_MODES, torchtitan_argv

__all__ = ["AC_MODES", "assets_command", "torchtitan_argv"]


def assets_command():
    """`phantora assets torchtitan` (click command)."""
    from .assets import assets_torchtitan_cmd

    return assets_torchtitan_cmd

"""`phantora assets`: one sub-command per framework of the registry (`FRAMEWORKS`) whose package has
`assets_command()`, e.g. `phantora assets torchtitan`."""

from __future__ import annotations

import click

from . import FRAMEWORKS, framework_module


class _AssetsGroup(click.Group):
    """`phantora assets`: one sub-command per framework of the registry whose package has `assets_command()`;
    a framework's package is imported only when its sub-command runs or is listed."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [n for n in sorted(FRAMEWORKS) if hasattr(framework_module(n), "assets_command")]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in FRAMEWORKS:
            return None
        make = getattr(framework_module(cmd_name), "assets_command", None)
        return make() if make is not None else None


@click.group("assets", cls=_AssetsGroup)
def assets_cmd() -> None:
    """Generate local stand-ins for the assets a framework would download (no hub access)."""

"""A ground-truth record's workload options as a workload script's flags (shared by the frameworks whose training
script is a workload of presets/workloads/)."""

from __future__ import annotations

from ..errors import PresetError


def option_flags(options: dict | None, known: dict[str, tuple[str, str]], framework: str) -> list[str]:
    """`known` maps an option to (flag, kind): kind "bool" is a switch (true adds the flag), any other passes the
    value. Unknown options and non-boolean switches are errors naming the record key."""
    argv: list[str] = []
    for key, value in sorted((options or {}).items()):
        if key not in known:
            raise PresetError(f"unknown {framework} option '{key}' (known: {', '.join(sorted(known))})",
                              key=f"workload.options.{key}")
        flag, kind = known[key]
        if kind == "bool":
            if value is True:
                argv.append(flag)
            elif value is not False:
                raise PresetError(f"expected true or false, got {value!r}", key=f"workload.options.{key}")
        else:
            argv += [flag, str(value)]
    return argv

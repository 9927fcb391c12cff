"""Exceptions that carry a message meant for the user (the CLI prints them without a traceback)."""


class PhantoraError(Exception):
    """Base class of every error Phantora reports to the user."""


class PresetError(PhantoraError):
    """A preset (GPU, cluster, model) is missing, malformed or inconsistent.

    The message always names the file and, where it applies, the key.
    """

    def __init__(self, message: str, *, file: str | None = None, key: str | None = None):
        where = ""
        if file:
            where = f"{file}"
            if key:
                where += f": key '{key}'"
            where += ": "
        elif key:
            where = f"key '{key}': "
        super().__init__(where + message)
        self.file = file
        self.key = key


class SimulationError(PhantoraError):
    """The simulated program did something the simulator cannot honour (mismatched collectives, deadlock, OOM...)."""


class TraceError(PhantoraError):
    """A trace file is missing, corrupt, truncated beyond repair, or not a Phantora trace."""

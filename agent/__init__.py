"""zodiac-edge agent: the Datalog engine and the edge runtime a turbine runs.

The version is the installed distribution's (``pyproject.toml`` is its one source): the whole
project installs as ``zodiac-edge``, the edge image's agent alone as ``zodiac-edge-agent``
(``packaging/edge/pyproject.toml``). It is looked up only when asked for, since reading the
installed metadata costs a tenth of a second that no command should pay at start.
"""

from __future__ import annotations

import argparse
from importlib import metadata

DISTRIBUTIONS = ("zodiac-edge", "zodiac-edge-agent")


def installed_version() -> str | None:
    """The installed distribution's version, or None when the code runs from a checkout that
    was never installed."""
    for name in DISTRIBUTIONS:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def version_text(program: str) -> str:
    """What ``PROGRAM --version`` prints: ``zodiac-edge 0.2.0``."""
    version = installed_version()
    if version is None:
        return f"{program}: version unknown (not installed; pip install -e . in the checkout)"
    return f"{program} {version}"


class VersionAction(argparse.Action):
    """``--version`` for the project's commands: prints :func:`version_text` and exits 0.
    (argparse's own ``action="version"`` takes the text when the parser is built, which would
    read the installed metadata at every start.)"""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, **kwargs) -> None:
        kwargs.setdefault("help", "print the version and exit")
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(version_text(parser.prog))
        parser.exit()


def __getattr__(name: str) -> str:
    if name == "__version__":
        return installed_version() or "unknown"
    raise AttributeError(f"module 'agent' has no attribute {name!r}")

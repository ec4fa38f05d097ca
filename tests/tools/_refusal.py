"""A tool's command line refusing bad arguments before it starts anything."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest


def assert_refused(main: Callable[[list[str]], object], out: Path, capsys, argv: list[str],
                   named: str) -> None:
    """``main(--out OUT ARGV)`` exits with status 2 naming ``named`` and writes nothing."""
    with pytest.raises(SystemExit) as exit_:
        main(["--out", str(out), *argv])
    assert exit_.value.code == 2
    assert named in capsys.readouterr().err
    assert not out.exists()

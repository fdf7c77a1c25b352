"""The CLI in-process for the bad-input tests."""

from __future__ import annotations

from sftree import cli


def fails(capsys, argv: list[str], *needles: str) -> str:
    """Run the CLI in-process: exit 2, one stderr line holding every needle, no traceback."""
    capsys.readouterr()
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    for n in needles:
        assert n in err, err
    return err

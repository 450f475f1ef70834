"""``python -m raycl.train SPACE``: one run at the space's default point (no sweep)."""

from __future__ import annotations

from raycl import cli
from raycl.errors import cli_entry


@cli_entry
def main(argv: list[str] | None = None, *, prog: str | None = None) -> None:
    cli.space_verb("train", __doc__ or "", argv, sweep=False, prog=prog)


if __name__ == "__main__":
    main()

"""``python -m raycl.tune SPACE``: a Ray Tune sweep; each trial mines ‖ trains ‖ evaluates; select on dev."""

from __future__ import annotations

from raycl import cli
from raycl.errors import cli_entry


@cli_entry
def main(argv: list[str] | None = None, *, prog: str | None = None) -> None:
    cli.space_verb("tune", __doc__ or "", argv, sweep=True, prog=prog)


if __name__ == "__main__":
    main()

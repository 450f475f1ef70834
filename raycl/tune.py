"""``python -m raycl.tune SPACE``: a Ray Tune sweep; each trial mines ‖ trains ‖ evaluates; select on dev."""

from __future__ import annotations

from raycl import cli
from raycl.errors import cli_entry


@cli_entry
def main(argv: list[str] | None = None) -> None:
    args = cli.space_parser("python -m raycl.tune", __doc__ or "", sweep=True).parse_args(argv)
    space, run_dir = cli.load(args)
    space = cli.check_resources(space, sweep=True, address=args.address, connected=False)
    cli.check_inputs(space, run_dir)
    cli.quiet_ray()
    from raycl.distributed.runtime import cpus_of_a_run, init_ray, local_cpus

    init_ray(args.address, num_cpus=local_cpus(cpus_of_a_run(space.config)))
    space = cli.check_resources(space, sweep=True, address=args.address, connected=True)
    summary = cli.run(space, run_dir, sweep=True, track=args.track)
    cli.finish(summary, as_json=args.json)


if __name__ == "__main__":
    main()

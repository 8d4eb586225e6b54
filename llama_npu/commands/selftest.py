"""`llama-npu selftest`: each Ascend-only path proved on this device (selftest/run.py)."""
from __future__ import annotations

from ..common.launcher import is_scheduler
from ..strategies.parallel import run_scheduler


def add_parser(subparsers) -> None:
    selftest = subparsers.add_parser("selftest", help="prove each Ascend-only path on this device in minutes, "
                                                      "each check against a reference computed in the same run")
    selftest.add_argument("--device", default="auto", choices=("auto", "cpu", "ascend"),
                          help="auto: the NPU when there is one, else the CPU")
    selftest.add_argument("--json", metavar="FILE", help="also write the device and every check as JSON "
                                                         "(attach it to a bug report)")
    selftest.add_argument("--speed", action="store_true", help="also time a 1B step (tokens/s, MFU)")
    selftest.add_argument("--dry-run", action="store_true", help="build and validate every check's recipes for "
                                                                 "--soc and list what each would compare and its "
                                                                 "tolerance, running nothing (no card needed)")
    selftest.add_argument("--soc", metavar="S", help="with --dry-run: the SoC to plan for (cpu, 910a, 910b, 910b4)")
    selftest.set_defaults(func=run)


def run(args) -> int:
    # imported here: they load numpy, which --help does not need
    from ..selftest.dry_run import dry_run
    from ..selftest.run import SelftestError, run_selftest

    if args.dry_run:
        return dry_run(args.soc, args.json)
    if args.soc:
        raise SelftestError("selftest --soc: only with --dry-run (a run reads the SoC from its device)")
    if is_scheduler():  # msrun runs the command as its scheduler too (scripts/launch.sh --selftest)
        run_scheduler()
        return 0
    return run_selftest(args.device, args.json, args.speed)

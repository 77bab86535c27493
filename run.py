#!/usr/bin/env python3
"""The kernel playground's command line: `python run.py --help` says how to use it (kp/command.py holds what each
flag runs; this file only starts a candidate's box, or hands the command to a warm judge, before torch's import)."""
import os
import sys

from kp.command import cli, exit_now, parse_args, start_box_early, warm_fits, warm_slot_main
from kp.command import expand_variants, judge_opts, main  # noqa: F401 (the tests and tools reach them here)
from kp.lib import bytecode

if __name__ == "__main__":
    bytecode.enable()  # before torch's import: where the host writes no bytecode, the cache keeps it
    if {"-h", "--help"} & set(sys.argv[1:]):  # the usage, without torch's import (seconds) first
        parse_args(sys.argv[1:])
    from kp.batch import server
    if "--warm-serve" in sys.argv:  # the warm judge itself (kp.batch.server), started by a --warm command
        sys.exit(server.serve(*sys.argv[sys.argv.index("--warm-serve") + 1:][:2], slot_main=warm_slot_main))
    if "--warm-stop" in sys.argv:
        sys.exit(server.stop())
    if server.wanted(sys.argv[1:]) and warm_fits(sys.argv[1:]):
        code = server.run_warm(sys.argv[1:])
        if code is not None:
            sys.stdout.flush()
            os._exit(code)
    start_box_early(sys.argv[1:])  # the candidate's box starts before the judge imports torch (in cli())
    try:
        exit_now(cli())
    except BrokenPipeError:  # output piped into e.g. `head`, which stopped reading
        sys.stderr.close()
        os._exit(0)

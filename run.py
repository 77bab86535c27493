#!/usr/bin/env python3
"""The kernel playground's command line: `python run.py --help` says how to use it (kp/command.py holds what each
flag runs and kp.command.entry what this file runs; `pip install -e .` installs the same as the command `kp`)."""

from kp.command import entry

# the tests and tools reach these here
from kp.command import cli, expand_variants, judge_opts, main, parse_args  # noqa: F401

if __name__ == "__main__":
    entry()

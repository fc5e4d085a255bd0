"""The ``dbtune`` command.

    dbtune threadcheck URL [--concurrency N] [--duration S] [--json]
    dbtune triggers CONFIG_URI [--drop] [--sql]

See :doc:`threadcheck` and :doc:`sqlmethods`.
"""

import argparse
import sys

from . import threadcheck, triggers


def main(argv=None):
    """Run ``dbtune``; its exit status."""
    parser = argparse.ArgumentParser(
        prog='dbtune', description='pyramid_dbtune tools'
    )
    commands = parser.add_subparsers(
        title='commands', dest='command', required=True
    )
    threadcheck.add_parser(commands)
    triggers.add_parser(commands)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print(f'dbtune {args.command}: interrupted', file=sys.stderr)
        return 130
    except Exception as exc:  # exit 1 means a finding: this is not one
        print(
            f'dbtune {args.command}: unexpected error: '
            f'{exc.__class__.__name__}: {exc}',
            file=sys.stderr,
        )
        return 2

"""The ``dbtune`` command.

    dbtune threadcheck URL [--concurrency N] [--duration S] [--json]

See :doc:`threadcheck`.
"""

import argparse

from . import threadcheck


def main(argv=None):
    """Run ``dbtune``; its exit status."""
    parser = argparse.ArgumentParser(
        prog='dbtune', description='pyramid_dbtune tools'
    )
    commands = parser.add_subparsers(
        title='commands', dest='command', required=True
    )
    threadcheck.add_parser(commands)
    args = parser.parse_args(argv)
    return args.run(args)

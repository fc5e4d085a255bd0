"""``dbtune triggers CONFIG_URI``: install the triggers that tell every
process of the application of the changes committed to its database by
anyone (``psql``, a cron job, another application).

Run it as a user that owns the tables, again whenever the application's
SQL methods change: it replaces what it installed before. With
``dbtune.cache.listen = true`` each process then hears of the changes.
"""

import sys


def add_parser(commands):
    """Add ``triggers`` to the ``dbtune`` command's subcommands."""
    parser = commands.add_parser(
        'triggers',
        help='install the triggers that tell the application of changes '
        'made outside it',
        description=__doc__.split('\n\n')[1].replace('\n', ' '),
    )
    parser.add_argument(
        'config_uri', help="the application's ini file, e.g. production.ini"
    )
    parser.add_argument(
        '--drop', action='store_true', help='drop the triggers instead'
    )
    parser.add_argument(
        '--sql',
        action='store_true',
        help='print the statements, and run none of them',
    )
    parser.set_defaults(run=run)


def run(args, stdout=None, stderr=None):
    """The command: 0 when done, 2 when it cannot be."""
    from pyramid.paster import bootstrap

    from ..cache import triggers

    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    env = bootstrap(args.config_uri)
    try:
        dbtune = env['registry'].dbtune
        tables = triggers.tables_to_watch(dbtune)
        if not tables:
            stderr.write(
                'dbtune triggers: no cached SQL method reads a table by '
                'name: there is nothing to watch\n'
            )
            return 2
        engine = dbtune.router.writer
        if args.sql:
            for statement in triggers.trigger_sql(engine, tables, args.drop):
                stdout.write(statement + ';\n')
            return 0
        try:
            triggers.install(engine, tables, args.drop)
        except ValueError as exc:
            stderr.write(f'dbtune triggers: {exc}\n')
            return 2
        done = 'dropped the triggers of' if args.drop else 'installed on'
        for table, columns in tables.items():
            told = f' (rows told by {", ".join(columns)})' if columns else ''
            stdout.write(f'dbtune triggers: {done} {table}{told}\n')
        return 0
    finally:
        env['registry'].dbtune.close()
        env['closer']()

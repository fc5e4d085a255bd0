"""``dbtune triggers CONFIG_URI``: install the triggers that tell every
process of the application of the changes committed to its database by
anyone (``psql``, a cron job, another application).

Run it as a user that owns the tables, again whenever the application's
SQL methods change: it replaces what it installed before. With
``dbtune.cache.listen = true`` each process then hears of the changes.
A Zope site, whose ZSQL Methods name their tables in their SQL alone,
names them: ``dbtune triggers --url URL --tables property,area``.
"""

import sys

from sqlalchemy import create_engine


class _Refused(Exception):
    """What the command cannot do, said to the user."""


def add_parser(commands):
    """Add ``triggers`` to the ``dbtune`` command's subcommands."""
    parser = commands.add_parser(
        'triggers',
        help='install the triggers that tell the application of changes '
        'made outside it',
        description=' '.join(
            p.replace('\n', ' ') for p in __doc__.split('\n\n')[1:]
        ),
    )
    parser.add_argument(
        'config_uri',
        nargs='?',
        help="the application's ini file, e.g. production.ini",
    )
    parser.add_argument('--url', help='a database URL, instead of an ini file')
    parser.add_argument(
        '--tables',
        default='',
        help='tables to watch, comma-separated, besides those of the '
        "application's cached SQL methods",
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
    from ..cache import triggers

    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    closers = []
    try:
        engine, tables, refused = _what(args, closers)
        try:
            if args.sql:
                statements = triggers.trigger_sql(engine, tables, args.drop)
                stdout.write(''.join(f'{s};\n' for s in statements))
                return 0
            triggers.install(engine, tables, args.drop)
        except ValueError as exc:  # a database that has no triggers
            raise _Refused(str(exc)) from None
        done = 'dropped the triggers of' if args.drop else 'installed on'
        for table, columns in tables.items():
            columns = sorted({*columns[0], *columns[1]}) if columns else ()
            told = f' (rows told by {", ".join(columns)})' if columns else ''
            stdout.write(f'dbtune triggers: {done} {table}{told}\n')
        for table, why in refused.items():
            stderr.write(
                f'dbtune triggers: cannot watch {table}: {why}; triggers on '
                f'{table} may be on another table. Name it {table}, '
                'unquoted, on the search path\n'
            )
        return 2 if refused else 0
    except _Refused as exc:
        stderr.write(f'dbtune triggers: {exc}\n')
        return 2
    finally:
        for close in reversed(closers):
            close()


def _what(args, closers):
    """The engine, the tables (table: ``(keys, extra)`` columns) to
    work on, and those it cannot (table: why)."""
    from ..cache import triggers
    from ..sql.conditions import PLAIN

    named = args.tables.replace(',', ' ').split()
    for table in named:
        if not PLAIN.match(table):
            raise _Refused(
                f'{table!r} is not a plain table name (lower case letters, '
                'digits and _, unquoted)'
            )
    if (args.config_uri is None) == (args.url is None):
        raise _Refused('give an ini file or --url, one of them')
    if args.url is not None:
        if not named:
            raise _Refused('--url needs --tables: the tables to watch')
        engine = create_engine(args.url)
        closers.append(engine.dispose)
        return engine, dict.fromkeys(sorted(set(named)), ((), ())), {}
    from pyramid.paster import bootstrap

    from ..cache import changes

    # No listener: it would look for the triggers before they are made.
    changes.STARTS = False
    try:
        env = bootstrap(args.config_uri)
    finally:
        changes.STARTS = True
    closers.append(env['closer'])
    dbtune = getattr(env['registry'], 'dbtune', None)
    if dbtune is None:
        raise _Refused(
            f'the application of {args.config_uri} does not include '
            'pyramid_dbtune'
        )
    closers.append(dbtune.close)
    if dbtune.router is None:
        raise _Refused(
            f'the application of {args.config_uri} has no database: set '
            'dbtune.url (or sqlalchemy.url)'
        )
    tables = triggers.tables_to_watch(dbtune)
    for table in named:
        tables.setdefault(table, ((), ()))
    if not tables:
        raise _Refused(
            'no cached SQL method reads a table by name: there is nothing '
            'to watch'
        )
    with dbtune.router.writer.connect() as connection:
        refused = triggers.misnamed(dbtune, connection)
    for table in refused:
        del tables[table]
    return dbtune.router.writer, dict(sorted(tables.items())), refused

"""Another OS process for the shared-cache tests.

Builds the same app as the test (same database, same memcached) and runs
the SQL method calls it is given; prints the answer and the queries it
ran, as JSON.

    python dbtune_worker.py '{"url": ..., "settings": {...},
                              "methods": [...], "calls": [[name, {}], ...]}'
"""

import json
import sys

from conftest import call, make_app, query_log


def main(argv):
    job = json.loads(argv[1])
    app = make_app(job['url'], job['methods'], job['settings'], tables=False)
    log = query_log(app)
    answer = call(app, *job['calls'])
    answer['queries'] = len(log.statements)
    app.app.registry.dbtune.router.dispose()
    print(json.dumps(answer))


if __name__ == '__main__':
    main(sys.argv)

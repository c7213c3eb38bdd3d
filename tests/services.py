"""Where the integration suite finds its services (one place for the URLs and defaults).

``STOCKSENTRY_TEST_PG``: a PostgreSQL server URL (the database part is replaced per test);
``STOCKSENTRY_TEST_REDIS``: a Redis URL; ``STOCKSENTRY_TEST_MYSQL``: a MySQL or MariaDB
server URL (the database part is replaced per test). The defaults are the services
``make services`` starts on 127.0.0.1.
"""

from __future__ import annotations

import os

PG_SERVER = os.environ.get("STOCKSENTRY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("STOCKSENTRY_TEST_REDIS", "redis://127.0.0.1:6379/0")
MYSQL_SERVER = os.environ.get("STOCKSENTRY_TEST_MYSQL", "mysql://root@127.0.0.1:3306/test")

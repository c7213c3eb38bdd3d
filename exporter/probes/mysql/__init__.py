"""The MySQL and MariaDB probes (read-only, like the PostgreSQL ones in :mod:`..postgres`)."""

#!/usr/bin/env bash
# Make sure the services the tests use are up (PostgreSQL, Redis, MariaDB); start the
# ones that are down with the machine's own start commands. Idempotent: a running service
# is left alone.
set -euo pipefail

pg_up() { pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; }
redis_up() { redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; }
mariadb_up() { mariadb-admin -h 127.0.0.1 -P 3306 --connect-timeout=2 ping >/dev/null 2>&1; }

if ! pg_up; then
  echo "services: starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n 1)" main start
  for _ in $(seq 1 30); do pg_up && break; sleep 1; done
fi
pg_up || { echo "services: PostgreSQL is not answering on 127.0.0.1:5432" >&2; exit 1; }

if ! redis_up; then
  echo "services: starting Redis"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  for _ in $(seq 1 30); do redis_up && break; sleep 1; done
fi
redis_up || { echo "services: Redis is not answering on 127.0.0.1:6379" >&2; exit 1; }
if ! mariadb_up; then
  echo "services: starting MariaDB"
  # mariadbd reads /etc/mysql/my.cnf (user, datadir, 127.0.0.1:3306); its socket and pid
  # file live in /run/mysqld, which does not survive a reboot. --oknodo: a mariadbd that
  # is already starting is left alone.
  install -d -o mysql -g mysql -m 0755 /run/mysqld
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd
  for _ in $(seq 1 30); do mariadb_up && break; sleep 1; done
fi
mariadb_up || { echo "services: MariaDB is not answering on 127.0.0.1:3306" >&2; exit 1; }
echo "services: PostgreSQL, Redis and MariaDB are up"

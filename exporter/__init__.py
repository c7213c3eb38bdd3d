"""stocksentry's sidecar side and the ``stocksentry`` command line.

One role per module or subpackage:

- the sidecar: ``config`` (the declarative config model and its YAML loader),
  ``webconfig`` (TLS and basic auth), ``server`` (``/metrics``, ``/healthz``,
  ``/readyz``), ``multiproc`` (the app's multiprocess directory merged), ``probes``
  (the read-only database and Redis probes), ``sidecar`` (config in, sidecar out);
  its dependencies come from the ``exporter`` extra (Redis support from ``redis``, loaded
  only when a ``redis:`` section is configured);
- the command line: ``cli`` (the ``stocksentry`` dispatcher, ``python -m
  stocksentry.exporter``), ``commandline`` (exit codes, the one error line, bounded
  argument types), ``sidecar_cli`` (``exporter`` and ``check-config``);
- ``lab``: the flash-sale lab behind ``stocksentry demo`` (the ``lab`` extra);
- ``investigate``: ``stocksentry reconcile`` and ``stocksentry timeline`` (the
  ``reconcile`` extra for the former);
- shared definitions: ``durations`` (the one duration grammar), ``invariants`` (the one
  builder of the invariant SQL), ``dburl`` (database URLs shown without their password).

This package imports nothing at import time, so ``stocksentry --help`` stays cheap.

Example::

    from stocksentry.exporter.cli import main

    main(["demo", "--buyers", "200", "--stock", "20"])
"""

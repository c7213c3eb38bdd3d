"""Secret URLs: what the config takes from outside the file.

A secret URL comes from exactly one of ``url_env``, ``url_file`` (a regular file of at
most 64 KiB) or ``url`` (only without a password); it is held in a
:class:`~stocksentry.instrumentation.secrets.Secret` at once and never quoted in a message.
"""

from __future__ import annotations

import re
from typing import Final

from stocksentry.instrumentation.secrets import Secret, url_has_password
from yaml.nodes import ScalarNode

from ..commandline import installed
from ..dburl import dialect_of, libpq_url, mysql_connect_args
from ..inputs import URL_FILE_LIMIT, InputFileError, read_text_bounded, shorten
from .errors import CheckedMapping, Context, describe, join
from .kinds import Named, read_path
from .specs import URL_KEYS, UrlKeys
from .yamlsource import TAG_STR, line_of

# A libpq connection string: `keyword = value` pairs, the first keyword at the start.
_CONNINFO: Final = re.compile(r"\s*[A-Za-z_]+\s*=")
_ENV_NAME: Final = Named("[A-Za-z_][A-Za-z0-9_]*", "an environment variable name", "")


def resolve_url(ctx: Context, section: CheckedMapping, spec: UrlKeys) -> tuple[Secret, str]:
    """The URL of ``section`` and where it came from (``env NAME``, ``file PATH`` or
    ``literal``), from exactly one of :data:`~.specs.URL_KEYS`."""
    # In document order, so that "only one of" points at the later of two keys.
    given = sorted(
        (name for name in URL_KEYS if name in section.entries),
        key=lambda name: line_of(section.entries[name].key),
    )
    if not given:
        ctx.fail(section.node, section.path, "one of url_env, url_file or url is required")
    if len(given) > 1:
        found = ", ".join(given)
        section.fail(given[1], f"give only one of url_env, url_file and url (found {found})")
    name = given[0]
    node = section.require(name)
    path = join(section.path, name)
    if name == "url":
        if not isinstance(node, ScalarNode) or node.tag != TAG_STR:
            ctx.fail(node, path, f"expected a string, got {describe(node, secret=True)}")
        value = str(node.value).strip()
        if url_has_password(value):
            ctx.fail(
                node,
                path,
                "the URL carries a password; put the URL in an environment variable "
                "(url_env) or a file (url_file) instead",
            )
        origin = "literal"
        label = "the URL"
    elif name == "url_env":
        variable = _ENV_NAME.read(ctx, node, path)
        value = ctx.environ.get(variable, "").strip()
        if not value:
            ctx.fail(node, path, f"environment variable {variable} is not set or empty")
        origin = f"env {variable}"
        label = f"environment variable {variable}"
    else:
        file_path = read_path(ctx, node, path)
        try:
            value = read_text_bounded(file_path, limit=URL_FILE_LIMIT, what="url_file").strip()
        except InputFileError as exc:
            ctx.fail(node, path, f"cannot read {shorten(str(file_path), 200)}: {exc.problem}")
        if not value:
            ctx.fail(node, path, f"{file_path} is empty")
        origin = f"file {file_path}"
        label = str(file_path)
    scheme_ok = any(value.startswith(f"{s}://") for s in spec.schemes) or (
        # A libpq key=value string opens with a keyword: `postgres:/db?sslmode=x` is a
        # URL with a broken scheme, not one.
        spec.accept_conninfo and "://" not in value and _CONNINFO.match(value) is not None
    )
    if not scheme_ok:
        # Never echo the value: it may be a secret that is only badly formatted.
        # The plain schemes only: a driver-qualified one (mysql+aiomysql://) is a variant.
        plain = [f"{s}://" for s in spec.schemes if "+" not in s]
        expected = ", ".join(plain[:-1]) + f" or {plain[-1]}"
        ctx.fail(node, path, f"{label} does not hold a {spec.what} URL ({expected}...)")
    dialect = dialect_of(value)
    if dialect in ("mysql", "mariadb"):
        # Its query options (TLS files included) are checked now, not at each connect:
        # a bad one is the config's mistake, not a database that is down.
        try:
            mysql_connect_args(value)
        except ValueError as exc:  # its message never quotes the URL
            ctx.fail(node, path, f"{label}: {exc}")
    if dialect == "postgresql" and installed("psycopg"):
        # libpq parses the URL at every connect: one it refuses (an unknown option, a bad
        # %-escape) is the config's mistake, not a database that is down. The parser's
        # message is never passed on: it quotes the part it did not understand.
        from psycopg import Error as PsycopgError
        from psycopg.conninfo import conninfo_to_dict

        try:
            conninfo_to_dict(libpq_url(value))
        except PsycopgError:
            ctx.fail(node, path, f"{label} cannot be parsed as a PostgreSQL URL")
    return Secret(value), origin

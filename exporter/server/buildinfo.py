"""What build of the exporter runs: ``stocksentry_build_info{version, revision,
python_version} 1`` (the exporters' ``*_build_info`` convention) and the landing page's line.

Example::

    >>> BuildInfo("0.1.0", "4f2a9c1", "3.12.7").describe()
    'stocksentry 0.1.0 (revision 4f2a9c1, Python 3.12.7)'
"""

from __future__ import annotations

import json
import platform
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from importlib import metadata, resources
from importlib.resources.abc import Traversable
from typing import Final

from prometheus_client.core import GaugeMetricFamily, Metric
from stocksentry.instrumentation import catalog

DISTRIBUTION: Final = "stocksentry"
#: Where the wheel build writes the commit, inside the ``stocksentry.exporter`` package.
REVISION_FILE: Final = "REVISION"
UNKNOWN: Final = "unknown"
# A commit id or a tag-like name; anything else (a stray file, a template left
# unfilled) reads as unknown rather than becoming a label value.
_REVISION: Final = re.compile(r"[0-9A-Za-z][0-9A-Za-z._+-]{0,63}")


@dataclass(frozen=True, slots=True)
class BuildInfo:
    """The three labels of ``stocksentry_build_info``."""

    version: str
    revision: str
    python_version: str

    def describe(self) -> str:
        """One line for logs and the landing page."""
        return (
            f"stocksentry {self.version} (revision {self.revision}, Python {self.python_version})"
        )


def read_revision(package: Traversable | None = None, direct_url: str | None = None) -> str:
    """The source revision: the package's ``REVISION`` file, a PEP 610 VCS commit, or unknown.

    ``package`` is the folder of ``stocksentry.exporter`` (the installed one by default);
    ``direct_url`` the text of the distribution's ``direct_url.json`` (read from the
    installed distribution by default).
    """
    if package is None:
        package = resources.files("stocksentry.exporter")
    try:
        text = package.joinpath(REVISION_FILE).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        text = ""
    if _REVISION.fullmatch(text):
        return text
    if direct_url is None:
        try:
            direct_url = metadata.distribution(DISTRIBUTION).read_text("direct_url.json")
        except metadata.PackageNotFoundError:
            direct_url = None
    if direct_url:
        try:
            commit = json.loads(direct_url).get("vcs_info", {}).get("commit_id", "")
        except (ValueError, AttributeError):
            commit = ""
        if isinstance(commit, str) and _REVISION.fullmatch(commit):
            return commit
    return UNKNOWN


@cache
def build_info() -> BuildInfo:
    """This process's build (read once: none of it changes while the process runs)."""
    try:
        version = metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        version = UNKNOWN
    return BuildInfo(version, read_revision(), platform.python_version())


class BuildInfoCollector:
    """Exports ``stocksentry_build_info`` with the labels of ``info`` (this build's by default)."""

    def __init__(self, info: BuildInfo | None = None) -> None:
        self.info = info if info is not None else build_info()

    def collect(self) -> Iterator[Metric]:
        spec = catalog.BUILD_INFO
        family = GaugeMetricFamily(spec.base_name, spec.help, labels=list(spec.labels))
        family.add_metric([self.info.version, self.info.revision, self.info.python_version], 1.0)
        yield family

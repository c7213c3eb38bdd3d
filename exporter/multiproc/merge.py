"""One scrape's merge: files added one by one, families built at the end.

prometheus_client's semantics: counters, summaries and histograms are summed across
pids (histogram buckets made cumulative again, ``_count`` from the ``+Inf`` bucket);
gauges follow the mode of their file (``all``: one series per pid with a ``pid`` label;
``min``/``max``/``sum``: aggregated; ``mostrecent``: the newest timestamp wins). Internal
to :mod:`stocksentry.exporter.multiproc`.

Example::

    merge = Merge(collector_key_of, known_keys)
    merge.add(parse_name("counter_12.db"), read_entries(path))
    families = merge.families()
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Exemplar, Sample
from prometheus_client.utils import floatToGoString

from .files import SUMMED_TYPES, Entries, FileName, Key

__all__ = ["Merge"]

# floatToGoString is untyped in prometheus_client; this gives it a type once.
_go_float: Final[Callable[[float], str]] = floatToGoString


class Merge:
    """Accumulators for one scrape; files are added one by one, families built at the end."""

    def __init__(self, key_of: Callable[[bytes], Key], known: dict[bytes, Key]) -> None:
        self._key_of = key_of
        self._known = known
        # counter/summary/histogram: key -> sum over pids; dicts keep first-seen order.
        self.summed: dict[str, dict[bytes, float]] = {t: {} for t in SUMMED_TYPES}
        # all/liveall: (key, pid) -> value.
        self.per_pid: dict[tuple[bytes, str], float] = {}
        # min/max/sum (and live variants): key -> value; mostrecent: key -> (ts, value).
        self.aggregated: dict[str, dict[bytes, float]] = {}
        self.most_recent: dict[bytes, tuple[float, float]] = {}
        # key bytes -> (timestamp, exemplar): the latest across workers.
        self.exemplars: dict[bytes, tuple[float, Exemplar]] = {}
        self.files = 0

    def add_exemplars(self, entries: dict[bytes, tuple[float, Exemplar]]) -> None:
        """Merge one worker's exemplars: per sample key, the newest timestamp wins."""
        held_of = self.exemplars
        for raw, item in entries.items():
            held = held_of.get(raw)
            if held is None or item[0] > held[0]:
                held_of[raw] = item

    def add(self, name: FileName, entries: Entries) -> None:
        """Merge one file's entries; a key that does not parse skips the whole file."""
        # Validate every key before merging anything: a bad key skips the whole file.
        # Keys seen by an earlier scrape are already valid, so this is one lookup each.
        known = self._known
        for raw, _, _ in entries:
            if raw not in known:
                self._key_of(raw)
        self.files += 1
        if name.typ != "gauge":
            acc = self.summed[name.typ]
            get = acc.get
            for raw, value, _ in entries:
                acc[raw] = get(raw, 0.0) + value
            return
        mode = name.mode.removeprefix("live")
        if mode == "all":
            per_pid = self.per_pid
            for raw, value, _ in entries:
                per_pid[(raw, name.pid)] = value
        elif mode == "mostrecent":
            recent = self.most_recent
            for raw, value, timestamp in entries:
                held = recent.get(raw)
                # Strictly newer than what we hold (or than 0.0): prometheus_client's rule.
                if timestamp > (held[0] if held else 0.0):
                    recent[raw] = (timestamp, value)
        else:
            acc = self.aggregated.setdefault(mode, {})
            get = acc.get
            if mode == "sum":
                for raw, value, _ in entries:
                    acc[raw] = get(raw, 0.0) + value
            elif mode == "min":
                for raw, value, _ in entries:
                    current = get(raw)
                    if current is None or value < current:
                        acc[raw] = value
            else:  # max
                for raw, value, _ in entries:
                    current = get(raw)
                    if current is None or value > current:
                        acc[raw] = value

    def families(self) -> list[Metric]:
        """Build the merged families: counters, gauges, histograms, summaries.

        Help comes from the first file (in directory order) that names the metric, as in
        prometheus_client. A metric written under two types keeps the type that comes
        first here; the rest is dropped rather than exposed under a wrong TYPE line.
        """
        key_of = self._key_of
        by_name: dict[str, Metric] = {}
        exemplars = self.exemplars

        def exemplar_of(raw: bytes) -> Exemplar | None:
            held = exemplars.get(raw)
            return held[1] if held is not None else None

        def samples_of(key: Key, typ: str) -> list[Sample] | None:
            family = by_name.get(key.metric)
            if family is None:
                family = by_name[key.metric] = Metric(key.metric, key.help, typ)
            elif family.type != typ:
                return None
            return family.samples

        for raw, value in self.summed["counter"].items():
            key = key_of(raw)
            samples = samples_of(key, "counter")
            if samples is not None:
                exemplar = exemplar_of(raw) if exemplars else None
                samples.append(Sample(key.sample, key.labels_dict, value, None, exemplar))

        for (raw, pid), value in self.per_pid.items():
            key = key_of(raw)
            samples = samples_of(key, "gauge")
            if samples is not None:
                samples.append(Sample(key.sample, {**key.labels_dict, "pid": pid}, value))
        for acc in self.aggregated.values():
            for raw, value in acc.items():
                key = key_of(raw)
                samples = samples_of(key, "gauge")
                if samples is not None:
                    samples.append(Sample(key.sample, key.labels_dict, value))
        for raw, (_, value) in self.most_recent.items():
            key = key_of(raw)
            samples = samples_of(key, "gauge")
            if samples is not None:
                samples.append(Sample(key.sample, key.labels_dict, value))

        # Histograms: buckets are stored per bound and per pid; sum them, then make them
        # cumulative per label set and derive _count from the +Inf bucket.
        Group = tuple[str, tuple[tuple[str, str], ...]]
        buckets_of: dict[Group, dict[float, float]] = {}
        # The first key of each group stands for its metric (name, help).
        others_of: dict[Group, tuple[Key, list[Sample]]] = {}
        # (group, bound) -> exemplar of that bucket, when a worker recorded one.
        bucket_exemplars: dict[tuple[Group, float], Exemplar] = {}
        for raw, value in self.summed["histogram"].items():
            key = key_of(raw)
            group = (key.metric, key.labels_without_le)
            first = others_of.get(group)
            if first is None:
                first = others_of[group] = (key, [])
                buckets_of[group] = {}
            others = first[1]
            if key.le is None:
                others.append(Sample(key.sample, key.labels_dict, value))
            else:
                buckets = buckets_of[group]
                buckets[key.le] = buckets.get(key.le, 0.0) + value
                if exemplars:
                    exemplar = exemplar_of(raw)
                    if exemplar is not None:
                        bucket_exemplars[(group, key.le)] = exemplar
        for group, (first_key, others) in others_of.items():
            metric_name, labels = group
            samples = samples_of(first_key, "histogram")
            if samples is None:
                continue
            buckets = buckets_of[group]
            if buckets:
                running = 0.0
                for bound in sorted(buckets):
                    running += buckets[bound]
                    samples.append(
                        Sample(
                            f"{metric_name}_bucket",
                            dict((*labels, ("le", _go_float(bound)))),
                            running,
                            None,
                            bucket_exemplars.get((group, bound)) if bucket_exemplars else None,
                        )
                    )
                samples.append(Sample(f"{metric_name}_count", dict(labels), running))
            samples.extend(others)

        for raw, value in self.summed["summary"].items():
            key = key_of(raw)
            samples = samples_of(key, "summary")
            if samples is not None:
                samples.append(Sample(key.sample, key.labels_dict, value))
        return [family for family in by_name.values() if family.samples]

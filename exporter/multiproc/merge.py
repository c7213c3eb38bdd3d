"""One scrape's merge: files added one by one, families built at the end."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Exemplar, Sample
from prometheus_client.utils import floatToGoString

from .exemplars import ExemplarEntries
from .files import SUMMED_TYPES, Entries, FileName, Key, Values, fold

# floatToGoString is untyped in prometheus_client; this gives it a type once.
_go_float: Final[Callable[[float], str]] = floatToGoString


class Merge:
    """The accumulators of one scrape."""

    def __init__(self, key_of: Callable[[bytes], Key]) -> None:
        self._key_of = key_of
        # counter/summary/histogram: key -> sum over pids; dicts keep first-seen order.
        self.summed: dict[str, Values] = {t: {} for t in SUMMED_TYPES}
        # all/liveall: (key, pid) -> value.
        self.per_pid: dict[tuple[bytes, str], float] = {}
        # min/max/sum/mostrecent (live variants alike): mode -> key -> (value, timestamp).
        self.aggregated: dict[str, Values] = {}
        # key bytes -> (timestamp, exemplar): the latest across workers.
        self.exemplars: ExemplarEntries = {}
        self.files = 0

    def add(self, name: FileName, entries: Entries) -> None:
        """Merge one file's entries; a key that does not parse skips the whole file."""
        for raw, _, _ in entries:
            self._key_of(raw)  # parsed once, then cached by the collector
        self.files += 1
        if name.typ != "gauge":
            fold(self.summed[name.typ], "", entries)
            return
        mode = name.mode.removeprefix("live")
        if mode == "all":
            for raw, value, _ in entries:
                self.per_pid[(raw, name.pid)] = value
        else:
            fold(self.aggregated.setdefault(mode, {}), mode, entries)

    def families(self) -> list[Metric]:
        """Build the merged families: counters, gauges, histograms, summaries.

        Help comes from the first file (in directory order) that names the metric, as in
        prometheus_client. A metric written under two types keeps the type that comes
        first here; the rest is dropped rather than exposed under a wrong TYPE line.
        """
        key_of = self._key_of
        by_name: dict[str, Metric] = {}

        def exemplar_of(raw: bytes) -> Exemplar | None:
            held = self.exemplars.get(raw)
            return held[1] if held is not None else None

        def add(key: Key, typ: str, sample: Sample) -> None:
            family = by_name.get(key.metric)
            if family is None:
                family = by_name[key.metric] = Metric(key.metric, key.help, typ)
            if family.type == typ:
                family.samples.append(sample)

        for raw, (value, _) in self.summed["counter"].items():
            key = key_of(raw)
            add(key, "counter", Sample(key.sample, key.labels_dict, value, None, exemplar_of(raw)))
        for (raw, pid), value in self.per_pid.items():
            key = key_of(raw)
            add(key, "gauge", Sample(key.sample, {**key.labels_dict, "pid": pid}, value))
        # mostrecent last (a stable sort), as the merge has always ordered them.
        for _, acc in sorted(self.aggregated.items(), key=lambda item: item[0] == "mostrecent"):
            for raw, (value, _) in acc.items():
                key = key_of(raw)
                add(key, "gauge", Sample(key.sample, key.labels_dict, value))

        # Histograms: buckets are stored per bound and per pid; sum them, then make them
        # cumulative per label set and derive _count from the +Inf bucket.
        Group = tuple[str, tuple[tuple[str, str], ...]]
        Buckets = dict[float, tuple[float, Exemplar | None]]
        # The first key of each group stands for its metric (name, help).
        groups: dict[Group, tuple[Key, Buckets, list[Sample]]] = {}
        for raw, (value, _) in self.summed["histogram"].items():
            key = key_of(raw)
            _, buckets, others = groups.setdefault(
                (key.metric, key.labels_without_le), (key, {}, [])
            )
            if key.le is None:
                others.append(Sample(key.sample, key.labels_dict, value))
            else:
                held, exemplar = buckets.get(key.le, (0.0, None))
                buckets[key.le] = (held + value, exemplar_of(raw) or exemplar)
        for (metric_name, labels), (first_key, buckets, others) in groups.items():
            if buckets:
                running = 0.0
                for bound in sorted(buckets):
                    count, exemplar = buckets[bound]
                    running += count
                    labelled = dict((*labels, ("le", _go_float(bound))))
                    bucket = Sample(f"{metric_name}_bucket", labelled, running, None, exemplar)
                    add(first_key, "histogram", bucket)
                add(first_key, "histogram", Sample(f"{metric_name}_count", dict(labels), running))
            for sample in others:
                add(first_key, "histogram", sample)

        for raw, (value, _) in self.summed["summary"].items():
            key = key_of(raw)
            add(key, "summary", Sample(key.sample, key.labels_dict, value))
        return [family for family in by_name.values() if family.samples]

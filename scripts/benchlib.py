"""What the benchmark scripts share: reading the programs' JSON records and the statistics
they print (median, range, Jain's fairness index, a verdict against a target).

Imported by scripts/bench-clients; its unit tests are tests/scripts/benchlib_test.py.
"""
import json
import statistics


def json_records(text):
    """The JSON objects among a program's output lines (07 prints one per run with --json)."""
    records = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            records.append(value)
    return records


def median(values):
    """The median of the values that are known (None is unknown); None if none are."""
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def spread(values):
    """(lowest, highest) of the known values, or (None, None)."""
    known = [v for v in values if v is not None]
    return (min(known), max(known)) if known else (None, None)


def jain(rates):
    """Jain's fairness index of the rates: 1 when all are equal, 1/n when one has everything.
    None for no rates or all zero."""
    rates = list(rates)
    if not rates:
        return None
    total = sum(rates)
    squares = sum(r * r for r in rates)
    if squares == 0:
        return None
    return total * total / (len(rates) * squares)


def aggregate_gbps(records):
    """All clients' bytes over the span from the first one's start to the last one's end
    (each record's started_at and ended_at, Unix seconds); None without those fields."""
    spans = [(r.get("started_at"), r.get("ended_at")) for r in records]
    if not records or any(s is None or e is None for s, e in spans):
        return None
    begin = min(s for s, _ in spans)
    end = max(e for _, e in spans)
    if end <= begin:
        return None
    return 8 * sum(r["bytes"] for r in records) / (end - begin) / 1e9


def progress_points(text):
    """(seconds, bytes) of each progress line of a 07 client ("progress: 1.0 s, ..., 12.5 MB,")."""
    points = []
    for line in text.splitlines():
        if not line.startswith("progress: "):
            continue
        fields = line[len("progress: "):].split(", ")
        try:
            seconds = float(fields[0].split()[0])
            mb = next(float(f.split()[0]) for f in fields if f.endswith(" MB"))
        except (ValueError, IndexError, StopIteration):
            continue
        points.append((seconds, mb * 1e6))
    return points


def bytes_at(points, t):
    """Bytes a client had received at t seconds into its run, linear between its points."""
    before = (0.0, 0.0)
    for point in points:
        if point[0] >= t:
            span = point[0] - before[0]
            share = (t - before[0]) / span if span > 0 else 1.0
            return before[1] + share * (point[1] - before[1])
        before = point
    return before[1]


def window_rates(clients, shortest=0.5):
    """Each client's Gbps over the window in which all of them ran, and the window (begin,
    end) in Unix seconds. A client: {"started_at", "ended_at", "bytes", "points"}, its points
    (seconds into its run, bytes) from its progress lines. ([], None) when they never all ran
    together for `shortest` seconds."""
    if not clients:
        return [], None
    begin = max(c["started_at"] for c in clients)
    end = min(c["ended_at"] for c in clients)
    if end - begin < shortest:
        return [], None
    rates = []
    for c in clients:
        points = c["points"] + [(c["ended_at"] - c["started_at"], c["bytes"])]
        moved = (bytes_at(points, end - c["started_at"]) -
                 bytes_at(points, begin - c["started_at"]))
        rates.append(8 * moved / (end - begin) / 1e9)
    return rates, (begin, end)


def verdict(value, target, higher_is_better=True):
    """'meets' or 'misses' the target, or 'unknown' when the value is."""
    if value is None:
        return "unknown"
    ok = value >= target if higher_is_better else value <= target
    return "meets" if ok else "misses"


def fmt(value, digits=3):
    """A figure for a table: '-' where unknown."""
    return "-" if value is None else f"{value:.{digits}f}"

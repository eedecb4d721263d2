"""What the benchmark scripts share: reading the programs' JSON records and the statistics
they print (median, range, spread, Jain's fairness index, a verdict against a target or from
two rungs' runs). The shell scripts call it through scripts/bench-lib.sh (main, below).

Imported by scripts/bench-clients; its unit tests are tests/scripts/benchlib_test.py.
"""
import json
import statistics


def json_records(text, as_written=False):
    """The JSON objects among a program's output lines (07 prints one per run with --json).
    as_written: decimals kept as their text ("1.00"), for the shell scripts' tables."""
    records = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            value = json.loads(line, parse_float=str if as_written else float)
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


def own_rates(records):
    """Each client's Gbps over its own run (its bytes over its seconds, from its first request
    to its last WRITE landed)."""
    return [8 * r["bytes"] / r["seconds"] / 1e9 if r.get("seconds") else None for r in records]


def start_skew(records):
    """Seconds from the first client's start to the last one's (None without started_at)."""
    starts = [r.get("started_at") for r in records]
    if not starts or None in starts:
        return None
    return max(starts) - min(starts)


def verdict(value, target, higher_is_better=True):
    """'meets' or 'misses' the target, or 'unknown' when the value is."""
    if value is None:
        return "unknown"
    ok = value >= target if higher_is_better else value <= target
    return "meets" if ok else "misses"


def fmt(value, digits=3):
    """A figure for a table: '-' where unknown."""
    return "-" if value is None else f"{value:.{digits}f}"


def _numbers(words):
    return [float(w) for w in words.split()]


def runs_verdict(below, this, direction):
    """The verdict on a rung from its runs and the rung's below (space-separated figures):
    'gain' when every run of THIS beats every run of BELOW in `direction` ('up' or 'down';
    the ranges do not overlap), 'loss' when every run is worse, 'no change' when the ranges
    overlap, 'too few runs' with fewer than 3 on either side."""
    if direction not in ("up", "down"):
        raise ValueError(f'verdict: direction is up or down, not "{direction}"')
    a, b = _numbers(below), _numbers(this)
    if len(a) < 3 or len(b) < 3:
        return "too few runs"
    if direction == "down":
        a, b = [-v for v in a], [-v for v in b]
    return "gain" if min(b) > max(a) else "loss" if max(b) < min(a) else "no change"


def runs_removed(below, this):
    """The verdict on a rung that makes a count zero by construction (a pinned thread cannot
    move): 'gain' when THIS counted none in any run and BELOW some in one, 'loss' when THIS
    counted any, 'cannot show' when neither did, 'too few runs' below 3 a side. The ranges of
    runs_verdict would call 0-3 against 0 no change: but THIS side's 0 is the rung's guarantee."""
    a, b = _numbers(below), _numbers(this)
    if len(a) < 3 or len(b) < 3:
        return "too few runs"
    if any(v != 0 for v in b):
        return "loss"
    return "gain" if any(v != 0 for v in a) else "cannot show"


def spread_percent(runs):
    """(highest - lowest) / median of the runs, in percent, as text; '-' for fewer than 2
    runs or a median of 0."""
    values = _numbers(runs)
    if len(values) < 2 or statistics.median(values) == 0:
        return "-"
    return f"{100 * (max(values) - min(values)) / statistics.median(values):.0f}"


def field_values(text, name):
    """NAME of each JSON record in `text`, as text: '' where null or absent (bench-lib.sh's
    `field`)."""
    values = []
    for record in json_records(text, as_written=True):
        value = record.get(name)
        if value is None:
            values.append("")
        elif isinstance(value, bool):
            values.append("true" if value else "false")
        else:
            values.append(str(value))
    return values


def field_rows(text, names):
    """Per JSON record in `text`, its NAMEs (a.b: field b of object a) tab-separated, as
    field_values writes each (journey's rows)."""
    rows = []
    for record in json_records(text, as_written=True):
        values = []
        for name in names:
            value = record
            for part in name.split("."):
                value = value.get(part) if isinstance(value, dict) else None
            values.append(field_values(json.dumps({"v": value}), "v")[0])
        rows.append("\t".join(values))
    return rows


def busy_nics(text):
    """Per JSON record in `text`, "BUSY/ALL": how many of its NICs carried bytes (the client's
    own count of what each NIC's lanes received) of those it used; '' where a record lists no
    NICs. A per-NIC rate divides by BUSY, not by the lanes asked for (bench-fabtests)."""
    counts = []
    for record in json_records(text, as_written=True):
        nics = record.get("nics") or []
        busy = sum(1 for n in nics if n.get("bytes", 0) > 0)
        counts.append(f"{busy}/{len(nics)}" if nics else "")
    return counts


def main(argv, stdin):
    """The shell scripts' entry: `benchlib.py field NAME` (each record's NAME), `benchlib.py
    fields NAME...` (a tab-separated row per record) and `benchlib.py median` (of the numbers,
    one a line; '-' when there are none)."""
    if len(argv) == 2 and argv[0] == "field":
        return "\n".join(field_values(stdin, argv[1]))
    if argv == ["busy-nics"]:
        return "\n".join(busy_nics(stdin))
    if len(argv) >= 2 and argv[0] == "fields":
        return "\n".join(field_rows(stdin, argv[1:]))
    if argv == ["median"]:  # as the figures were written: the middle one's text, if odd
        numbers = []
        for word in stdin.split():
            try:
                numbers.append((float(word), word))
            except ValueError:  # "-": a run without the figure
                pass
        numbers.sort()
        if not numbers:
            return "-"
        middle = len(numbers) // 2
        if len(numbers) % 2:
            return numbers[middle][1]
        return f"{(numbers[middle - 1][0] + numbers[middle][0]) / 2:g}"
    if len(argv) == 4 and argv[0] == "verdict":
        return runs_verdict(argv[1], argv[2], argv[3])
    if len(argv) == 3 and argv[0] == "removed":
        return runs_removed(argv[1], argv[2])
    if len(argv) == 2 and argv[0] == "spread":
        return spread_percent(argv[1])
    raise SystemExit("usage: benchlib.py field NAME | fields NAME... | busy-nics | median"
                     " (input on stdin)"
                     " | verdict BELOW THIS up|down | removed BELOW THIS | spread RUNS")


if __name__ == "__main__":
    import signal
    import sys

    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # a reader that stops early (head) ends us quietly

    args = sys.argv[1:]
    try:  # the commands that read stdin are the first two
        out = main(args, sys.stdin.read() if args[:1] in (["field"], ["fields"], ["median"])
                   else "")
    except ValueError as e:
        print(e, file=sys.stderr)
        sys.exit(2)
    if out:
        print(out)

"""Unit tests of scripts/benchlib.py: the figures bench-clients prints come from these."""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import benchlib  # noqa: E402


class JsonRecords(unittest.TestCase):
    def test_keeps_objects_and_skips_the_rest(self):
        text = 'summary: 1 bytes\n{"bytes": 8, "seconds": 1}\n{broken\n[1, 2]\n  {"a": 1}  \n'
        self.assertEqual(benchlib.json_records(text), [{"bytes": 8, "seconds": 1}, {"a": 1}])


class Statistics(unittest.TestCase):
    def test_median_and_spread_ignore_unknown(self):
        self.assertEqual(benchlib.median([3, None, 1, 2]), 2)
        self.assertEqual(benchlib.median([4, 1, 2, 3]), 2.5)
        self.assertIsNone(benchlib.median([None]))
        self.assertEqual(benchlib.spread([5, None, 2, 9]), (2, 9))
        self.assertEqual(benchlib.spread([]), (None, None))

    def test_jain(self):
        self.assertAlmostEqual(benchlib.jain([5, 5, 5, 5]), 1.0)
        self.assertAlmostEqual(benchlib.jain([10, 0, 0, 0]), 0.25)  # one has all: 1/n
        self.assertAlmostEqual(benchlib.jain([1, 3]), 16 / (2 * 10))
        self.assertIsNone(benchlib.jain([]))
        self.assertIsNone(benchlib.jain([0, 0]))

    def test_aggregate_is_all_bytes_over_the_union_of_spans(self):
        records = [{"bytes": 10**9, "started_at": 100.0, "ended_at": 101.0},
                   {"bytes": 10**9, "started_at": 100.5, "ended_at": 102.0}]
        self.assertAlmostEqual(benchlib.aggregate_gbps(records), 16 / 2)  # 2 GB over 2 s
        self.assertIsNone(benchlib.aggregate_gbps([{"bytes": 1, "started_at": 1.0}]))
        self.assertIsNone(benchlib.aggregate_gbps([]))
        self.assertIsNone(
            benchlib.aggregate_gbps([{"bytes": 1, "started_at": 2.0, "ended_at": 2.0}]))

    def test_verdict_and_fmt(self):
        self.assertEqual(benchlib.verdict(0.95, 0.95), "meets")
        self.assertEqual(benchlib.verdict(0.94, 0.95), "misses")
        self.assertEqual(benchlib.verdict(3, 2, higher_is_better=False), "misses")
        self.assertEqual(benchlib.verdict(None, 1), "unknown")
        self.assertEqual(benchlib.fmt(None), "-")
        self.assertEqual(benchlib.fmt(1.23456, 2), "1.23")



class Clients(unittest.TestCase):
    def test_own_rates(self):
        records = [{"bytes": 1e9, "seconds": 2.0}, {"bytes": 5e8, "seconds": 0.5}, {"bytes": 1}]
        self.assertEqual(benchlib.own_rates(records), [4.0, 8.0, None])

    def test_aggregate_over_the_span(self):
        records = [{"bytes": 1e9, "started_at": 100.0, "ended_at": 102.0},
                   {"bytes": 1e9, "started_at": 101.0, "ended_at": 104.0}]
        self.assertAlmostEqual(benchlib.aggregate_gbps(records), 16 / 4)
        self.assertIsNone(benchlib.aggregate_gbps([{"bytes": 1, "started_at": 1.0}]))

    def test_start_skew(self):
        records = [{"started_at": 100.5}, {"started_at": 100.0}, {"started_at": 100.25}]
        self.assertAlmostEqual(benchlib.start_skew(records), 0.5)
        self.assertIsNone(benchlib.start_skew([{"bytes": 1}]))


class ShellEntry(unittest.TestCase):
    """What bench-lib.sh's `field` and `median` print (they call main)."""

    def test_field_of_each_record(self):
        text = 'progress: 1.0 s\n{"gbps":1.5,"step":null,"ok":true}\n{"gbps":2}\nsummary\n'
        self.assertEqual(benchlib.main(["field", "gbps"], text), "1.5\n2")
        self.assertEqual(benchlib.main(["field", "step"], text), "\n")  # null, absent: ""
        self.assertEqual(benchlib.main(["field", "ok"], text), "true\n")
        self.assertEqual(benchlib.main(["field", "x"], '{"x":1.00}'), "1.00")  # as written

    def test_rows_of_fields(self):
        text = '{"writes":8,"engine":{"placement":"cpus 0","locks":0}}\n{"writes":9,"engine":null}\n'
        self.assertEqual(benchlib.main(["fields", "writes", "engine.placement", "engine.locks"],
                                       text), "8\tcpus 0\t0\n9\t\t")

    def test_busy_nics_count_those_that_carried_bytes(self):
        text = ('{"nics":[{"name":"a","bytes":8},{"name":"b","bytes":0},{"name":"c","bytes":3}]}\n'
                '{"nics":[]}\n{"gbps":1}\n')
        self.assertEqual(benchlib.main(["busy-nics"], text), "2/3\n\n")

    def test_verdicts_from_runs(self):
        self.assertEqual(benchlib.main(["verdict", "1.0 1.1 1.2", "1.3 1.4 1.5", "up"], ""), "gain")
        self.assertEqual(benchlib.main(["verdict", "9 8 7", "3 2 1", "down"], ""), "gain")
        self.assertEqual(benchlib.runs_verdict("1.0 1.1 1.2", "1.2 1.4 1.5", "up"), "no change")
        self.assertEqual(benchlib.runs_verdict("1 2", "3 4 5", "up"), "too few runs")
        with self.assertRaises(ValueError):
            benchlib.runs_verdict("1 2 3", "4 5 6", "more")
        self.assertEqual(benchlib.runs_removed("0 3 0 1 0", "0 0 0 0 0"), "gain")
        self.assertEqual(benchlib.runs_removed("0 0 0", "0 0 0"), "cannot show")
        self.assertEqual(benchlib.runs_removed("2 3 4", "0 1 0"), "loss")
        self.assertEqual(benchlib.spread_percent("0.9 1.0 1.1 1.0 0.95"), "20")
        self.assertEqual(benchlib.spread_percent("7"), "-")

    def test_median_of_the_numbers(self):
        self.assertEqual(benchlib.main(["median"], "3\n1\n2\n"), "2")
        self.assertEqual(benchlib.main(["median"], "1.00\n0.50\n2.00\n"), "1.00")  # as written
        self.assertEqual(benchlib.main(["median"], "4\n1\n-\n"), "2.5")
        self.assertEqual(benchlib.main(["median"], ""), "-")
        with self.assertRaises(SystemExit):
            benchlib.main(["mean"], "")


if __name__ == "__main__":
    unittest.main()

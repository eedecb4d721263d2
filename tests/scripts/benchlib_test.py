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



class Window(unittest.TestCase):
    TEXT = ("progress: 1.0 s, 10.0% done, 5 ops, 100.0 MB, 0.800 Gbps, 0.0 Mpps; last 1.0 s: 0.800 Gbps\n"
            "progress: 2.0 s, 30.0% done, 15 ops, 300.0 MB, 1.200 Gbps, 0.0 Mpps\n"
            "progress: broken\n")

    def test_progress_points(self):
        self.assertEqual(benchlib.progress_points(self.TEXT), [(1.0, 100e6), (2.0, 300e6)])

    def test_bytes_at_interpolates(self):
        points = [(1.0, 100.0), (2.0, 300.0)]
        self.assertAlmostEqual(benchlib.bytes_at(points, 0.5), 50.0)
        self.assertAlmostEqual(benchlib.bytes_at(points, 1.5), 200.0)
        self.assertAlmostEqual(benchlib.bytes_at(points, 9.0), 300.0)

    def test_window_is_where_all_ran(self):
        # a: 100 MB/s from t=100 for 4 s; b: 50 MB/s from t=101 for 4 s. Together: 101..104.
        a = {"started_at": 100.0, "ended_at": 104.0, "bytes": 400e6,
             "points": [(1.0, 100e6), (2.0, 200e6), (3.0, 300e6)]}
        b = {"started_at": 101.0, "ended_at": 105.0, "bytes": 200e6,
             "points": [(1.0, 50e6), (2.0, 100e6), (3.0, 150e6)]}
        rates, window = benchlib.window_rates([a, b])
        self.assertEqual(window, (101.0, 104.0))
        self.assertAlmostEqual(rates[0], 0.8)
        self.assertAlmostEqual(rates[1], 0.4)

    def test_no_window_when_they_never_overlap(self):
        a = {"started_at": 0.0, "ended_at": 1.0, "bytes": 1, "points": []}
        b = {"started_at": 2.0, "ended_at": 3.0, "bytes": 1, "points": []}
        self.assertEqual(benchlib.window_rates([a, b]), ([], None))


if __name__ == "__main__":
    unittest.main()

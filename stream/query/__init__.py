"""Reading releases: range sums and totals per window with an interval for the true sum (``tops query``).

Python::

    from stream.query import Releases
    rel = Releases.from_file("releases.jsonl")           # or Releases.from_topic("localhost", seconds=10)
    ans = rel.range_sum(65536, 69631, stream="meter-1")   # ticks 65536..69631 inclusive
    ans.total, ans.low, ans.high                          # the released sum and the 95 % interval for the true sum
    per_hour = rel.per("hour", stream="meter-1")          # one Answer per hour of the releases' times
"""

from stream.query.releases import Answer, QueryError, Releases

__all__ = ["Answer", "QueryError", "Releases"]

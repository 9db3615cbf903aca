"""The plot reads the offline table of the benchmark notes."""

from troupe.ops.plot_benchmarks import offline_rows

NOTES = """
## Offline throughput (issue 4)

| date | commit | hardware | output tok/s | time |
|---|---|---|---:|---:|
| 2026-11-29 | 36025f4 | H200 | 7,021 | 19.08 s |
| 2026-11-29 | 8e3d726 | H200 | 14,076 | 9.52 s |

## Kernels
| 2026-11-29 | f579119 | H200 | 262.8 |
"""


def test_offline_rows_parse_only_the_offline_table() -> None:
    assert offline_rows(NOTES) == [("36025f4", 7021.0), ("8e3d726", 14076.0)]

"""`phantora net bench` prints nccl-tests' table and its JSON form."""

import json

from click.testing import CliRunner

from phantora.cli import main


def test_net_bench_json_rows():
    res = CliRunner().invoke(main, ["net", "bench", "--cluster", "h100-hgx", "--op", "all_gather", "-b", "1K", "-e", "1G",
                                    "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    assert [r["size"] for r in rows][0] == 1024 and rows[-1]["size"] == 2**30
    for r in rows:
        assert {"op", "size", "time_us", "algbw", "busbw"} <= set(r)
        # algbw is size / time, busbw = algbw * (n-1)/n for all_gather (nccl-tests PERFORMANCE.md)
        assert r["algbw"] == abs(r["algbw"]) and abs(r["algbw"] - r["size"] / r["time_us"] / 1e3) < 1e-6 * r["algbw"] + 1e-9
        assert abs(r["busbw"] - r["algbw"] * 7 / 8) < 1e-9 + 1e-9 * r["busbw"]


def test_net_bench_table_has_nccl_tests_columns():
    res = CliRunner().invoke(main, ["net", "bench", "--nodes", "2", "-b", "8", "-e", "8M"])
    assert res.exit_code == 0, res.output
    header = [l for l in res.output.splitlines() if "algbw" in l][0]
    for col in ("size", "count", "type", "time", "algbw", "busbw"):
        assert col in header
    assert "Avg bus bandwidth" in res.output


def test_bad_preset_is_a_clean_error():
    res = CliRunner().invoke(main, ["net", "bench", "--cluster", "nope"])
    assert res.exit_code != 0 and "unknown cluster preset" in res.output and "Traceback" not in res.output


def test_a_forced_algorithm_the_cluster_does_not_enable_is_refused():
    """`--algo tree` with `--set nccl.algorithms=["ring"]` ran tree, the algorithm the user had disabled; NCCL does
    not run an algorithm its build leaves out. The message names both options."""
    res = CliRunner().invoke(main, ["net", "bench", "--cluster", "h100-hgx", "--set", 'nccl.algorithms=["ring"]',
                                    "--algo", "tree", "--op", "all_reduce", "-b", "1M", "-e", "1M"])
    assert res.exit_code == 1 and "--algo tree" in res.output and "nccl.algorithms" in res.output, res.output

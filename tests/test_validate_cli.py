"""phantora-validate refuses unknown suites with a clear message instead of reporting an empty success."""

from click.testing import CliRunner

from phantora_validation.cli import main


def test_unknown_suite_is_an_error():
    res = CliRunner().invoke(main, ["--suite", "no-such-suite"])
    assert res.exit_code == 2
    assert "no ground-truth suite 'no-such-suite'" in res.output

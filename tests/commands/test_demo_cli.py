"""`asp demo`: variant parsing and config validation before anything heavy starts."""
import pytest

from mindspeed_asp.cli import main
from mindspeed_asp.commands.demo import DEFAULT_VARIANTS, parse_variants
from mindspeed_asp.errors import ConfigError


def test_default_variants_compare_stock_with_asp_at_two_lags():
    assert parse_variants(DEFAULT_VARIANTS) == [
        ("stock", "stock", ["asp.max_lag=0"]),  # stock trains at lag 0 only: said, so no config lag refuses it
        ("asp", "asp", []),
        ("asp_max_lag2", "asp", ["asp.max_lag=2"]),
    ]


def test_the_stock_variant_runs_at_lag_0_whatever_the_command_line_gives_the_others(tmp_path):
    """`asp demo asp.max_lag=2`: the asp variants take it, stock keeps lag 0 (composed as given, a stock run
    with an explicit max_lag 2 would be refused)."""
    from mindspeed_asp.commands.demo import _variant_overrides
    from mindspeed_asp.commands.train import build_config

    cfgs = {name: build_config(None, _variant_overrides(["asp.max_lag=2"], extra), mode, str(tmp_path / name))
            for name, mode, extra in parse_variants(DEFAULT_VARIANTS)}
    assert {k: (c.asp.mode, c.asp.max_lag) for k, c in cfgs.items()} == {
        "stock": ("stock", 0), "asp": ("asp", 2), "asp_max_lag2": ("asp", 2)}
    with pytest.raises(ConfigError, match=r"asp\.mode=stock trains at lag 0 only"):
        name, mode, extra = parse_variants("stock@max_lag=1")[0]
        build_config(None, _variant_overrides([], extra), mode, str(tmp_path / name))


def test_variant_with_several_settings_gets_a_distinct_name():
    assert parse_variants("asp@max_lag=0@work_stealing=false") == [
        ("asp_max_lag0_work_stealingfalse", "asp", ["asp.max_lag=0", "asp.work_stealing=false"])]


@pytest.mark.parametrize("spec, message", [
    ("asp,asp", "listed twice"),
    ("asp@max_lag", "must look like key=value"),
    (",", "no variant"),
])
def test_bad_variants_are_refused(spec, message):
    with pytest.raises(ConfigError, match=message):
        parse_variants(spec)


def test_invalid_variant_setting_fails_before_ray_starts(tmp_path, capsys):
    # max_lag < 0 is rejected by the config validation that runs before Ray or vLLM are started.
    rc = main(["demo", "--out", str(tmp_path), "--modes", "stock,asp@max_lag=-1", "--quiet"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "asp.max_lag" in err
    assert not (tmp_path / "stock").exists()

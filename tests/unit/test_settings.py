"""Settings read from VLLM_PP_CUDAGRAPH_* variables."""

from __future__ import annotations

import pytest

from vllm_pp_cudagraph.shared.vllm_surface import parse_release
from vllm_pp_cudagraph.shared.settings import (
    DecodeCadence,
    LayerPartition,
    PPCudaGraphSettings,
    SettingsError,
)


def test_defaults_when_nothing_is_set():
    assert PPCudaGraphSettings.from_env({}).allow_unsupported_vllm is False


@pytest.mark.parametrize("raw", ["1", "true", "YES", " on "])
def test_true_spellings(raw):
    env = {"VLLM_PP_CUDAGRAPH_ALLOW_UNSUPPORTED_VLLM": raw}
    assert PPCudaGraphSettings.from_env(env).allow_unsupported_vllm is True


@pytest.mark.parametrize("raw", ["0", "false", "No", "off", ""])
def test_false_spellings(raw):
    env = {"VLLM_PP_CUDAGRAPH_ALLOW_UNSUPPORTED_VLLM": raw}
    assert PPCudaGraphSettings.from_env(env).allow_unsupported_vllm is False


def test_invalid_value_names_variable_value_and_allowed_values():
    with pytest.raises(SettingsError) as err:
        PPCudaGraphSettings.from_env({"VLLM_PP_CUDAGRAPH_ALLOW_UNSUPPORTED_VLLM": "2"})
    message = str(err.value)
    assert "VLLM_PP_CUDAGRAPH_ALLOW_UNSUPPORTED_VLLM='2'" in message
    assert "1/0, true/false, yes/no, on/off" in message


def test_unknown_variable_is_an_error_listing_known_ones():
    with pytest.raises(SettingsError) as err:
        PPCudaGraphSettings.from_env({"VLLM_PP_CUDAGRAPH_ALLOW_UNSUPORTED_VLLM": "1"})
    assert "VLLM_PP_CUDAGRAPH_ALLOW_UNSUPORTED_VLLM" in str(err.value)
    assert "VLLM_PP_CUDAGRAPH_ALLOW_UNSUPPORTED_VLLM" in str(err.value).split("Known")[1]


@pytest.mark.parametrize("raw", ["auto", " MERGE ", "fill", "Balance", "vllm"])
def test_decode_cadence_parses_whatever_its_case_and_spaces(raw):
    cadence = PPCudaGraphSettings.from_env({"VLLM_PP_CUDAGRAPH_DECODE_CADENCE": raw}).decode_cadence
    assert cadence.value == raw.strip().lower()


def test_decode_cadence_names_its_choices():
    with pytest.raises(SettingsError) as err:
        PPCudaGraphSettings.from_env({"VLLM_PP_CUDAGRAPH_DECODE_CADENCE": "1"})
    assert "VLLM_PP_CUDAGRAPH_DECODE_CADENCE='1'" in str(err.value)
    assert all(choice in str(err.value) for choice in ("auto", "merge", "balance", "fill", "vllm"))


def test_a_metrics_dir_that_is_a_file_or_cannot_be_made_is_refused_naming_it(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("")
    for bad in (afile, afile / "below"):
        with pytest.raises(SettingsError) as err:
            PPCudaGraphSettings.from_env({"VLLM_PP_CUDAGRAPH_METRICS_DIR": str(bad)})
        assert f"VLLM_PP_CUDAGRAPH_METRICS_DIR='{bad}': expected a directory" in str(err.value)


def test_a_metrics_dir_that_does_not_exist_yet_is_accepted_and_reading_it_leaves_nothing(
        tmp_path):
    """``check`` reads the settings: a new path is tried, not left behind (the server
    makes it when it starts)."""
    wanted = tmp_path / "a" / "b"
    settings = PPCudaGraphSettings.from_env({"VLLM_PP_CUDAGRAPH_METRICS_DIR": str(wanted)})
    assert settings.metrics_dir == str(wanted)
    assert list(tmp_path.iterdir()) == []


def test_a_replaced_setting_says_what_to_set_instead():
    with pytest.raises(SettingsError, match="FILL_IDLE_STEPS was replaced: set "
                       "VLLM_PP_CUDAGRAPH_DECODE_CADENCE"):
        PPCudaGraphSettings.from_env({"VLLM_PP_CUDAGRAPH_FILL_IDLE_STEPS": "0"})


def test_unrelated_variables_are_ignored_and_leave_every_default():
    # vLLM's own VLLM_USE_BREAKABLE_CUDAGRAPH is not the plugin's setting.
    environ = {"VLLM_PLUGINS": "x", "PATH": "/", "VLLM_USE_BREAKABLE_CUDAGRAPH": "1"}
    assert PPCudaGraphSettings.from_env(environ).model_dump() == {
        "allow_unsupported_vllm": False,
        "allow_unproven": False,
        "breakable": False,
        "decode_cadence": DecodeCadence.AUTO,
        "kv_update_in_graphs": True,
        "direct_handoff": False,
        "layer_partition": LayerPartition.VLLM,
        "stall_limit_s": 60.0,
        "metrics": True,
        "metrics_dir": "",
    }


@pytest.mark.parametrize(
    "version, release",
    [("0.26.0", (0, 26, 0)), ("0.26.1.dev3+gabc", (0, 26, 1)), ("1.2", (1, 2, 0)), ("x", None)],
)
def test_parse_release(version, release):
    assert parse_release(version) == release


def test_the_settings_page_the_readme_links_documents_every_setting():
    from pathlib import Path

    root = Path(__file__).parents[2]
    assert "(docs/settings.md)" in (root / "README.md").read_text()
    page = (root / "docs" / "settings.md").read_text()
    for variable, _, _ in PPCudaGraphSettings.describe():
        assert f"| `{variable}` |" in page, variable


@pytest.mark.parametrize("raw", ["3,3", " 20, 8 "])
def test_a_split_in_the_partition_setting_points_to_vllms_own_variable(raw):
    with pytest.raises(SettingsError) as err:
        PPCudaGraphSettings.from_env({"VLLM_PP_CUDAGRAPH_LAYER_PARTITION": raw})
    split = raw.replace(" ", "")
    assert f"VLLM_PP_LAYER_PARTITION={split}" in str(err.value)
    assert "'vllm' or 'auto'" in str(err.value)

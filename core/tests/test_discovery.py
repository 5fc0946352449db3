"""Plugin discovery and device selection, with throw-away distributions on sys.path."""

import json
import logging
import textwrap

import pytest
from core.cli import main
from core.discovery import discover, select_platform
from plugins import PLATFORM_API_VERSION, PlatformUnavailable


def make_dist(root, name, body, entry_name=None):
    """Write a minimal installed distribution: a module and a dist-info with one entry point."""
    entry_name = entry_name or name
    (root / f"{name}.py").write_text(textwrap.dedent(body))
    info = root / f"{name}-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.2.3\n")
    (info / "entry_points.txt").write_text(f"[core.platforms]\n{entry_name} = {name}\n")


def platform_module(name, priority, available=True, reason="", extra=""):
    return f"""
        import plugins

        class P(plugins.Platform):
            name = {name!r}
            device_type = "cpu"
            priority = {priority}
            {extra}
            def is_available(self):
                return {available}
            def unavailable_reason(self):
                return None if {available} else {reason!r}

        @plugins.hookimpl
        def register_platform():
            return P
        """


@pytest.fixture
def site(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("CORE_PLUGINS", raising=False)
    return tmp_path


def only(records, prefix="fk_"):
    return [r for r in records if r.name.startswith(prefix)]


def test_discovers_and_picks_highest_priority(site, caplog):
    make_dist(site, "fk_low", platform_module("fk_low", 5))
    make_dist(site, "fk_high", platform_module("fk_high", 50))
    make_dist(site, "fk_off", platform_module("fk_off", 99, available=False, reason="no fake device"))
    records = only(discover({}))
    assert [r.name for r in records] == ["fk_high", "fk_low", "fk_off"]
    assert records[0].version == "1.2.3" and records[0].dist_name == "fk_high"
    assert records[2].reason == "no fake device"
    caplog.set_level(logging.INFO)
    chosen = select_platform("auto", records)
    assert chosen.name == "fk_high"
    assert "selected fk_high (priority 50)" in caplog.text and "fk_off (no fake device)" in caplog.text


def test_priority_tie_broken_by_name(site):
    make_dist(site, "fk_b", platform_module("fk_b", 7))
    make_dist(site, "fk_a", platform_module("fk_a", 7))
    assert select_platform("auto", only(discover({}))).name == "fk_a"


def test_import_error_is_reported_and_skipped(site):
    make_dist(site, "fk_broken", "raise RuntimeError('boom at import')\n")
    make_dist(site, "fk_good", platform_module("fk_good", 1))
    records = {r.name: r for r in only(discover({}))}
    assert records["fk_good"].is_available
    assert not records["fk_broken"].is_available
    assert "RuntimeError: boom at import" in records["fk_broken"].reason


def test_is_available_that_raises_does_not_break_listing(site):
    body = platform_module("fk_raise", 1).replace("return True", "raise OSError('probe failed')")
    make_dist(site, "fk_raise", body)
    (record,) = only(discover({}))
    assert not record.is_available and "OSError: probe failed" in record.reason


def test_core_plugins_filter(site):
    make_dist(site, "fk_one", platform_module("fk_one", 1))
    make_dist(site, "fk_two", platform_module("fk_two", 2))
    records = discover({"CORE_PLUGINS": "fk_one"})
    assert [r.name for r in records if r.platform is not None] == ["fk_one"]
    (left_out,) = [r for r in records if r.name == "fk_two"]
    assert left_out.reason == "not loaded: CORE_PLUGINS=fk_one leaves it out"


def test_auto_names_the_plugins_core_plugins_left_out(site):
    """CORE_PLUGINS naming a plugin that is not installed: --device auto says what was left out, and why."""
    make_dist(site, "fk_one", platform_module("fk_one", 1))
    records = only(discover({"CORE_PLUGINS": "toy"}))
    with pytest.raises(PlatformUnavailable) as info:
        select_platform("auto", records)
    assert "fk_one: not loaded: CORE_PLUGINS=toy leaves it out" in str(info.value)
    assert "no plugin installed" not in str(info.value) and "Name an installed plugin in CORE_PLUGINS" in str(
        info.value
    )


def test_api_version_mismatch_is_rejected(site):
    make_dist(site, "fk_old", platform_module("fk_old", 1, extra=f"api_version = {PLATFORM_API_VERSION + 7}"))
    (record,) = only(discover({}))
    assert f"PLATFORM_API_VERSION {PLATFORM_API_VERSION + 7}" in record.reason
    assert f"provides {PLATFORM_API_VERSION}" in record.reason


def test_missing_hook_and_wrong_return(site):
    make_dist(site, "fk_nohook", "x = 1\n")
    make_dist(site, "fk_wrong", "import plugins\n@plugins.hookimpl\ndef register_platform():\n    return 42\n")
    records = {r.name: r for r in only(discover({}))}
    assert "implements no register_platform hook" in records["fk_nohook"].reason
    assert "returned 42" in records["fk_wrong"].reason


def test_selection_errors(site):
    make_dist(site, "fk_here", platform_module("fk_here", 1))
    make_dist(site, "fk_gone", platform_module("fk_gone", 1, available=False, reason="driver missing"))
    records = only(discover({}))
    with pytest.raises(
        PlatformUnavailable, match="Unknown device 'fk_hrse'. Installed: fk_gone, fk_here. Did you mean 'fk_here'"
    ) as info:
        select_platform("fk_hrse", records)
    assert "No backend of this project is called 'fk_hrse'" in str(info.value)
    assert "pip install plugin_fk" not in str(info.value) and "plugin_<name>" in str(info.value)
    with pytest.raises(PlatformUnavailable, match="Unknown device 'cpu_arm'.*To add it: pip install plugin_cpu_arm"):
        select_platform("cpu_arm", records)
    with pytest.raises(PlatformUnavailable, match="'fk_gone' is installed but unavailable: driver missing"):
        select_platform("fk_gone", records)
    assert select_platform("fk_here", records).name == "fk_here"
    with pytest.raises(PlatformUnavailable, match="No available device"):
        select_platform("auto", [r for r in records if r.name == "fk_gone"])


def test_devices_env_flags_an_invalid_value(site, monkeypatch, capsys):
    extra = 'env_vars = (plugins.EnvVar("FK_THREADS", int, 4, "threads"),)'
    make_dist(site, "fk_env", platform_module("fk_env", 1, extra=extra))
    monkeypatch.setenv("CORE_PLUGINS", "fk_env")
    monkeypatch.setenv("CORE_FK_THREADS", "abc")
    assert main(["devices", "--env"]) == 1
    out, err = capsys.readouterr()
    assert "abc (INVALID)" in out
    assert "error: CORE_FK_THREADS='abc' is not a valid int" in err
    monkeypatch.setenv("CORE_FK_THREADS", "8")
    assert main(["devices", "--env", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["value"] == "8" and row["error"] is None
    monkeypatch.delenv("CORE_FK_THREADS")
    monkeypatch.setenv("VLLM_FK_THREADS", "6")  # vLLM's spelling: the table names it, not CORE_'s
    assert main(["devices", "--env"]) == 0
    assert "VLLM_FK_THREADS  6" in capsys.readouterr().out

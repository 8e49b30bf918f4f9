"""Plugins found through the real ``chrysalis`` entry-point group of installed distributions.

Two throwaway distributions (``plugin_fixtures/throwaway_carrier`` and
``plugin_fixtures/rival_carrier``, both claiming the carrier scheme ``testcarrier``) are built
into wheels with pip and hatchling, installed with ``pip install --target`` into private
directories, and put on ``sys.path``; a fresh ``PluginRegistry`` must then find them through
``importlib.metadata`` exactly as it finds any installed plugin. Broken plugins are written as
bare ``.dist-info`` folders, which is all ``importlib.metadata`` needs.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from chrysalis.core import DatagramAddr
from chrysalis.core._plugin_types import PluginConflictError, PluginLoadError
from chrysalis.core._plugins import PluginRegistry
from chrysalis.core.hookspecs import CarrierSpec, hookimpl

FIXTURES = Path(__file__).parent / "plugin_fixtures"
PLUGIN_MODULES = ("throwaway_carrier", "rival_carrier", "broken_plugin_mod", "typo_plugin_mod")
THROWAWAY = "distribution throwaway-carrier 1.2 (entry point testcarrier)"
RIVAL = "distribution rival-carrier 0.3.1 (entry point testcarrier)"
PIP_TIMEOUT_S = 120


def _pip(*args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet", *args],
        check=True,
        timeout=PIP_TIMEOUT_S,
    )


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Build both fixture distributions once and install each into its own directory."""
    root = tmp_path_factory.mktemp("plugin-dists")
    wheels = root / "wheels"
    sources = []
    for name in ("throwaway_carrier", "rival_carrier"):
        source = root / "src" / name
        shutil.copytree(FIXTURES / name, source)  # build outside the repository
        sources.append(str(source))
    _pip("wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(wheels), *sources)
    installed = {}
    for name in ("throwaway_carrier", "rival_carrier"):
        (wheel,) = wheels.glob(f"{name}-*.whl")
        site = root / f"site-{name}"
        _pip("install", "--no-deps", "--no-index", "--target", str(site), str(wheel))
        installed[name] = site
    return installed


@pytest.fixture(autouse=True)
def forget_plugin_modules() -> Iterator[None]:
    """Each test imports the plugins afresh from the directories it put on sys.path."""
    yield
    for name in PLUGIN_MODULES:
        sys.modules.pop(name, None)


def _fake_distribution(
    site: Path, name: str, version: str, entry_points: str, modules: dict[str, str]
) -> None:
    dist_info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    )
    (dist_info / "entry_points.txt").write_text(f"[chrysalis]\n{entry_points}\n")
    for module, source in modules.items():
        (site / f"{module}.py").write_text(source)


def test_throwaway_distribution_carrier_is_found_and_opened(
    sites: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(sites["throwaway_carrier"]))
    registry = PluginRegistry()
    assert registry.load_entry_points() >= 1
    assert "throwaway-carrier:testcarrier" in registry.plugin_names()
    assert registry.carrier("testcarrier").description == "throwaway test carrier"
    sock = registry.open_carrier("testcarrier://0a0b", mtu=1200)
    assert type(sock).__name__ == "ThrowawaySocket"
    assert sock.address == DatagramAddr("testcarrier", b"\x0a\x0b")
    assert sock.options == {"mtu": 1200}
    module_file = Path(sys.modules["throwaway_carrier"].__file__ or "")
    assert module_file.parent == sites["throwaway_carrier"]


def test_loading_entry_points_again_loads_nothing_new(
    sites: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(sites["throwaway_carrier"]))
    registry = PluginRegistry()
    registry.load_entry_points()
    names = registry.plugin_names()
    assert registry.load_entry_points() == 0
    assert registry.plugin_names() == names
    assert "testcarrier" in registry.carriers()


def test_unregistered_entry_point_plugin_is_not_loaded_again(
    sites: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(sites["throwaway_carrier"]))
    registry = PluginRegistry()
    registry.load_entry_points()
    registry.unregister(name="throwaway-carrier:testcarrier")
    assert registry.load_entry_points() == 0
    assert "testcarrier" not in registry.carriers()


def test_code_plugin_claiming_the_same_scheme_names_the_distribution(
    sites: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    class Local:
        @hookimpl
        def chrysalis_carriers(self) -> list[CarrierSpec]:
            return [CarrierSpec("testcarrier", lambda address, /, **options: None)]

    monkeypatch.syspath_prepend(str(sites["throwaway_carrier"]))
    registry = PluginRegistry()
    registry.load_entry_points()
    registry.register(Local(), "local")
    with pytest.raises(PluginConflictError) as info:
        registry.carrier("testcarrier")
    assert str(info.value) == (
        f"carrier scheme 'testcarrier' is claimed by both {THROWAWAY} "
        "and registered in code as local"
    )


def test_two_distributions_claiming_one_scheme_name_both(
    sites: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(sites["throwaway_carrier"]))
    monkeypatch.syspath_prepend(str(sites["rival_carrier"]))
    registry = PluginRegistry()
    # Same entry-point name in both: each is registered under its own distribution.
    assert registry.load_entry_points() >= 2
    assert {"throwaway-carrier:testcarrier", "rival-carrier:testcarrier"} <= set(
        registry.plugin_names()
    )
    with pytest.raises(PluginConflictError) as info:
        registry.open_carrier("testcarrier://00")
    assert info.value.key == "testcarrier"
    assert set(info.value.owners) == {THROWAWAY, RIVAL}
    assert THROWAWAY in str(info.value)
    assert RIVAL in str(info.value)
    registry.unregister(name="rival-carrier:testcarrier")
    assert type(registry.open_carrier("testcarrier://00")).__name__ == "ThrowawaySocket"


def test_distribution_shadowed_further_down_sys_path_is_loaded_once(
    sites: dict[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    shadow = tmp_path / "shadow"
    shutil.copytree(sites["throwaway_carrier"], shadow)
    monkeypatch.syspath_prepend(str(shadow))
    monkeypatch.syspath_prepend(str(sites["throwaway_carrier"]))
    registry = PluginRegistry()
    registry.load_entry_points()
    assert [n for n in registry.plugin_names() if n.startswith("throwaway-carrier:")] == [
        "throwaway-carrier:testcarrier"
    ]
    assert "testcarrier" in registry.carriers()


def test_plugin_that_fails_to_import_names_distribution_and_entry_point(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _fake_distribution(
        tmp_path,
        "broken-plugin",
        "0.1",
        "broken = broken_plugin_mod",
        {"broken_plugin_mod": "raise ImportError('libfabric.so.1 not found')\n"},
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = PluginRegistry()
    with pytest.raises(PluginLoadError) as info:
        registry.load_entry_points()
    message = str(info.value)
    assert "entry point broken = 'broken_plugin_mod'" in message
    assert "distribution broken-plugin 0.1" in message
    assert "libfabric.so.1 not found" in message
    assert isinstance(info.value.__cause__, ImportError)
    # Not marked as loaded: fixing the module and retrying picks it up.
    (tmp_path / "broken_plugin_mod.py").write_text("VALUE = 1\n")
    sys.modules.pop("broken_plugin_mod", None)
    registry.load_entry_points()
    assert "broken-plugin:broken" in registry.plugin_names()


def test_plugin_with_misspelled_hook_is_a_load_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    source = (
        "from chrysalis.core.hookspecs import hookimpl\n"
        "@hookimpl\n"
        "def chrysalis_carrier():\n"
        "    return []\n"
    )
    _fake_distribution(
        tmp_path, "typo-plugin", "2.0", "typo = typo_plugin_mod", {"typo_plugin_mod": source}
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = PluginRegistry()
    with pytest.raises(PluginLoadError, match="cannot register plugin entry point typo") as info:
        registry.load_entry_points()
    assert "distribution typo-plugin 2.0" in str(info.value)
    assert "chrysalis_carrier" in str(info.value)
    assert "typo-plugin:typo" not in registry.plugin_names()

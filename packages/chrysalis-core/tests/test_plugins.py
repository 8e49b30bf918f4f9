"""The plugin registry with plugins registered in code: contributions, conflicts, lookups,
validation of contributed records, and the hook contracts themselves."""

from __future__ import annotations

import inspect
import pickle
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import pluggy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from chrysalis.core import DatagramAddr, Pid, hookspecs
from chrysalis.core import _plugins as plugins_module
from chrysalis.core._plugin_types import (
    MAX_DESCRIPTION_LENGTH,
    MAX_JOIN_OPTIONS,
    MAX_NAME_LENGTH,
    MAX_OPTION_VALUE_LENGTH,
    MAX_PEM_LENGTH,
    PluginConflictError,
    PluginError,
    PluginLoadError,
    PluginSpecError,
    UnknownPluginError,
    check_plugin_key,
)
from chrysalis.core._plugins import PluginRegistry, default_registry
from chrysalis.core.hookspecs import (
    AddressResolverSpec,
    CarrierSpec,
    IdentityMaterial,
    IdentityProviderSpec,
    JoinSettings,
    hookimpl,
)

CERT_PEM = b"-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n"
KEY_PEM = b"-----BEGIN PRIVATE KEY-----\nMIGHsecret\n-----END PRIVATE KEY-----\n"
PID = Pid(bytes(range(16)))
ADDR = DatagramAddr.inproc(1, 1)


@dataclass(frozen=True)
class FakeSocket:
    """What the test carriers "open": the inputs they were given."""

    scheme: str
    address: DatagramAddr
    options: dict[str, object]


class CarrierPlugin:
    """A plugin object contributing one carrier per scheme, counting its hook calls."""

    def __init__(self, *schemes: str) -> None:
        self.schemes = schemes
        self.calls = 0

    def _open(self, address: DatagramAddr, /, **options: object) -> FakeSocket:
        return FakeSocket(address.scheme, address, dict(options))

    @hookimpl
    def chrysalis_carriers(self) -> Sequence[CarrierSpec]:
        self.calls += 1
        return [CarrierSpec(s, self._open, f"carrier {s}") for s in self.schemes]


class StaticIdentity:
    def issue(self) -> IdentityMaterial:
        return IdentityMaterial(CERT_PEM, KEY_PEM, CERT_PEM)


def make_identity(**options: object) -> StaticIdentity:
    if options:
        raise TypeError(f"unknown options {sorted(options)}")
    return StaticIdentity()


def resolve_test_url(url: str) -> JoinSettings:
    _, _, rest = url.partition("://")
    return JoinSettings(DatagramAddr.parse(f"udp://{rest}"), PID, {"from": url})


class IdentityPlugin:
    def __init__(self, *names: str) -> None:
        self.names = names

    @hookimpl
    def chrysalis_identity_providers(self) -> Sequence[IdentityProviderSpec]:
        return tuple(IdentityProviderSpec(n, make_identity) for n in self.names)


class ResolverPlugin:
    def __init__(self, *schemes: str) -> None:
        self.schemes = schemes

    @hookimpl
    def chrysalis_address_resolvers(self) -> Sequence[AddressResolverSpec]:
        return [AddressResolverSpec(s, resolve_test_url) for s in self.schemes]


@pytest.fixture
def registry() -> PluginRegistry:
    return PluginRegistry()


# -- registering in code ------------------------------------------------------------------


def test_registered_plugin_contributes_its_carriers(registry: PluginRegistry) -> None:
    plugin = CarrierPlugin("udp", "fake+udp")
    assert registry.register(plugin, "fakes") == "fakes"
    assert list(registry.carriers()) == ["fake+udp", "udp"]
    assert registry.carrier("udp").description == "carrier udp"
    assert registry.plugin_names() == ("fakes",)


def test_open_carrier_parses_text_and_passes_options(registry: PluginRegistry) -> None:
    registry.register(CarrierPlugin("udp"))
    sock = registry.open_carrier("udp://127.0.0.1:4433", reuse_port=True)
    assert sock == FakeSocket("udp", DatagramAddr.udp("127.0.0.1", 4433), {"reuse_port": True})
    addr = DatagramAddr("fake", b"\x01")
    registry.register(CarrierPlugin("fake"), "second")
    assert registry.open_carrier(addr).address is addr


def test_open_carrier_for_unknown_scheme_raises_unknown(registry: PluginRegistry) -> None:
    registry.register(CarrierPlugin("udp"))
    with pytest.raises(UnknownPluginError, match=r"carrier scheme 'inproc'.*'udp'"):
        registry.open_carrier(DatagramAddr.inproc(1, 2))


def test_unregister_removes_contributions_and_invalidates_cache(
    registry: PluginRegistry,
) -> None:
    first, second = CarrierPlugin("a"), CarrierPlugin("b")
    registry.register(first, "first")
    assert list(registry.carriers()) == ["a"]
    registry.register(second, "second")
    assert list(registry.carriers()) == ["a", "b"]
    assert registry.unregister(first) is first
    assert list(registry.carriers()) == ["b"]
    assert registry.unregister(name="second") is second
    assert dict(registry.carriers()) == {}


def test_hooks_are_called_once_until_plugin_set_changes(registry: PluginRegistry) -> None:
    plugin = CarrierPlugin("a")
    registry.register(plugin)
    for _ in range(3):
        registry.carrier("a")
        registry.carriers()
    assert plugin.calls == 1
    registry.register(CarrierPlugin("b"), "other")
    registry.carrier("a")
    assert plugin.calls == 2


def test_tables_are_read_only(registry: PluginRegistry) -> None:
    registry.register(CarrierPlugin("a"))
    table = registry.carriers()
    with pytest.raises(TypeError):
        table["b"] = registry.carrier("a")  # type: ignore[index]


def test_registering_same_object_twice_is_refused(registry: PluginRegistry) -> None:
    plugin = CarrierPlugin("a")
    registry.register(plugin, "one")
    with pytest.raises(ValueError, match="already registered"):
        registry.register(plugin, "two")


def test_registering_a_taken_name_is_a_conflict(registry: PluginRegistry) -> None:
    registry.register(CarrierPlugin("a"), "shared")
    with pytest.raises(PluginConflictError) as info:
        registry.register(CarrierPlugin("b"), "shared")
    assert str(info.value) == (
        "plugin name 'shared' is claimed by both registered in code as shared "
        "and registered in code as shared"
    )


def test_unregister_of_unknown_plugin_is_refused(registry: PluginRegistry) -> None:
    with pytest.raises(ValueError, match="no plugin registered as 'ghost'"):
        registry.unregister(name="ghost")
    with pytest.raises(ValueError, match="not registered"):
        registry.unregister(CarrierPlugin("a"))
    with pytest.raises(ValueError, match="needs a plugin or a name"):
        registry.unregister()
    plugin = CarrierPlugin("a")
    registry.register(plugin, "mine")
    with pytest.raises(ValueError, match="not registered as 'other'"):
        registry.unregister(plugin, "other")


def test_blocked_name_is_not_registered(registry: PluginRegistry) -> None:
    registry._pm.set_blocked("blocked")
    assert registry.register(CarrierPlugin("a"), "blocked") is None
    assert dict(registry.carriers()) == {}


# -- conflicts ----------------------------------------------------------------------------


def test_duplicate_scheme_across_code_plugins_names_both(registry: PluginRegistry) -> None:
    registry.register(CarrierPlugin("udp"), "fast-udp")
    registry.register(CarrierPlugin("udp", "other"), "slow-udp")
    with pytest.raises(PluginConflictError) as info:
        registry.carrier("other")
    assert str(info.value) == (
        "carrier scheme 'udp' is claimed by both registered in code as fast-udp "
        "and registered in code as slow-udp"
    )
    assert (info.value.kind, info.value.key) == ("carrier scheme", "udp")
    with pytest.raises(PluginConflictError):
        registry.open_carrier("udp://127.0.0.1:1")


def test_conflict_is_resolved_by_unregistering_one_claimant(registry: PluginRegistry) -> None:
    registry.register(CarrierPlugin("udp"), "fast-udp")
    registry.register(CarrierPlugin("udp"), "slow-udp")
    with pytest.raises(PluginConflictError):
        registry.carriers()
    registry.unregister(name="fast-udp")
    assert list(registry.carriers()) == ["udp"]


def test_one_plugin_claiming_a_scheme_twice_is_a_conflict(registry: PluginRegistry) -> None:
    registry.register(CarrierPlugin("udp", "udp"), "stutter")
    with pytest.raises(PluginConflictError, match="registered in code as stutter and registered"):
        registry.carriers()


def test_duplicate_identity_provider_names_both(registry: PluginRegistry) -> None:
    registry.register(IdentityPlugin("files"), "ours")
    registry.register(IdentityPlugin("files", "vault"), "theirs")
    with pytest.raises(PluginConflictError) as info:
        registry.identity_provider("vault")
    assert str(info.value) == (
        "identity provider 'files' is claimed by both registered in code as ours "
        "and registered in code as theirs"
    )


def test_duplicate_address_resolver_names_both(registry: PluginRegistry) -> None:
    registry.register(ResolverPlugin("chrysalis"), "ours")
    registry.register(ResolverPlugin("chrysalis"), "theirs")
    with pytest.raises(PluginConflictError, match=r"'chrysalis' is claimed by both .*ours"):
        registry.address_resolvers()


def test_same_key_in_different_extension_points_is_no_conflict(registry: PluginRegistry) -> None:
    registry.register(CarrierPlugin("chrysalis"), "carrier")
    registry.register(ResolverPlugin("chrysalis"), "resolver")
    registry.register(IdentityPlugin("chrysalis"), "identity")
    assert list(registry.carriers()) == ["chrysalis"]
    assert list(registry.address_resolvers()) == ["chrysalis"]
    assert list(registry.identity_providers()) == ["chrysalis"]


# -- unknown keys -------------------------------------------------------------------------


def test_unknown_scheme_error_lists_available(registry: PluginRegistry) -> None:
    registry.register(CarrierPlugin("unixgram", "udp"))
    with pytest.raises(UnknownPluginError) as info:
        registry.carrier("quic")
    assert (
        str(info.value) == "no plugin provides carrier scheme 'quic'; available: 'udp', 'unixgram'"
    )
    assert info.value.available == ("udp", "unixgram")
    assert isinstance(info.value, LookupError)


def test_unknown_error_with_no_plugins_says_none(registry: PluginRegistry) -> None:
    with pytest.raises(UnknownPluginError, match="identity provider 'files'; available: none"):
        registry.identity_provider("files")
    with pytest.raises(UnknownPluginError, match="address resolver scheme 'x'; available: none"):
        registry.address_resolver("x")


# -- identity providers and resolvers -----------------------------------------------------


def test_identity_provider_creates_provider_that_issues_material(
    registry: PluginRegistry,
) -> None:
    registry.register(IdentityPlugin("static"))
    provider = registry.identity_provider("static").create()
    material = provider.issue()
    assert material == IdentityMaterial(CERT_PEM, KEY_PEM, CERT_PEM)
    assert b"secret" not in repr(material).encode()
    assert "key_pem" not in repr(material)


def test_resolve_address_uses_resolver_of_url_scheme(registry: PluginRegistry) -> None:
    registry.register(ResolverPlugin("chrysalis"))
    settings = registry.resolve_address("chrysalis://10.0.0.1:9000")
    assert settings == JoinSettings(
        DatagramAddr.udp("10.0.0.1", 9000), PID, {"from": "chrysalis://10.0.0.1:9000"}
    )


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("no-scheme-here", "has no scheme"),
        ("Upper://x", "not a lowercase identifier"),
        ("://x", "not a lowercase identifier"),
        ("c:" + "x" * 5000, "longer than 4096"),
    ],
)
def test_resolve_address_rejects_url_without_valid_scheme(
    registry: PluginRegistry, url: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        registry.resolve_address(url)


def test_resolve_address_rejects_resolver_returning_wrong_type(registry: PluginRegistry) -> None:
    class Liar:
        @hookimpl
        def chrysalis_address_resolvers(self) -> Sequence[AddressResolverSpec]:
            return [AddressResolverSpec("lie", lambda url: url)]  # type: ignore[arg-type,return-value]

    registry.register(Liar(), "liar")
    with pytest.raises(PluginSpecError, match="registered in code as liar: resolver for 'lie'"):
        registry.resolve_address("lie://x")


# -- malformed contributions --------------------------------------------------------------


def _open(address: DatagramAddr, /, **options: object) -> None:
    return None


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: CarrierSpec("UDP", _open), "not a lowercase identifier"),
        (lambda: CarrierSpec("", _open), "not a lowercase identifier"),
        (lambda: CarrierSpec("1udp", _open), "not a lowercase identifier"),
        (lambda: CarrierSpec("u" * (MAX_NAME_LENGTH + 1), _open), "longer than 32"),
        (lambda: CarrierSpec(b"udp", _open), "must be a str, not bytes"),  # type: ignore[arg-type]
        (lambda: CarrierSpec("udp", "not callable"), "must be callable"),  # type: ignore[arg-type]
        (lambda: CarrierSpec("udp", _open, 3), "description must be a str"),  # type: ignore[arg-type]
        (lambda: CarrierSpec("udp", _open, "d" * (MAX_DESCRIPTION_LENGTH + 1)), "longer than"),
        (lambda: IdentityProviderSpec("Files", make_identity), "not a lowercase identifier"),
        (lambda: IdentityProviderSpec("files", None), "must be callable"),  # type: ignore[arg-type]
        (lambda: AddressResolverSpec("a b", resolve_test_url), "not a lowercase identifier"),
        (lambda: AddressResolverSpec("ok", 42), "must be callable"),  # type: ignore[arg-type]
        (lambda: IdentityMaterial("text", KEY_PEM, CERT_PEM), "chain_pem must be bytes"),  # type: ignore[arg-type]
        (lambda: IdentityMaterial(CERT_PEM, CERT_PEM, CERT_PEM), "key_pem does not contain"),
        (lambda: IdentityMaterial(CERT_PEM, KEY_PEM, b""), "roots_pem does not contain"),
        (
            lambda: IdentityMaterial(
                CERT_PEM * (MAX_PEM_LENGTH // len(CERT_PEM) + 1), KEY_PEM, CERT_PEM
            ),
            "longer than",
        ),
        (lambda: JoinSettings("udp://127.0.0.1:1"), "address must be a DatagramAddr"),  # type: ignore[arg-type]
        (lambda: JoinSettings(ADDR, b"\x00" * 16), "authority must be a Pid"),  # type: ignore[arg-type]
        (lambda: JoinSettings(ADDR, None, [("a", "b")]), "must be a mapping"),  # type: ignore[arg-type]
        (lambda: JoinSettings(ADDR, None, {"a": 1}), "must be str"),  # type: ignore[dict-item]
        (lambda: JoinSettings(ADDR, None, {"": "x"}), "1 to 64 characters"),
        (
            lambda: JoinSettings(
                DatagramAddr.inproc(1, 1), None, {"k": "v" * (MAX_OPTION_VALUE_LENGTH + 1)}
            ),
            "value longer than",
        ),
        (
            lambda: JoinSettings(
                DatagramAddr.inproc(1, 1), None, {str(i): "" for i in range(MAX_JOIN_OPTIONS + 1)}
            ),
            "more than 64 entries",
        ),
    ],
)
def test_malformed_spec_values_are_rejected(build: object, message: str) -> None:
    assert callable(build)
    with pytest.raises(PluginSpecError, match=message):
        build()


def test_spec_errors_are_value_errors_and_plugin_errors() -> None:
    with pytest.raises(ValueError):
        CarrierSpec("UDP", _open)
    assert issubclass(PluginSpecError, PluginError)
    assert issubclass(UnknownPluginError, LookupError)


@settings(max_examples=150, deadline=None)
@given(st.from_regex(r"[a-z][a-z0-9+.\-]{0,31}", fullmatch=True))
def test_valid_keys_are_accepted(key: str) -> None:
    assert check_plugin_key(key, "scheme") == key
    assert CarrierSpec(key, _open).scheme == key


_KEY_RE = re.compile(r"[a-z][a-z0-9+.\-]{0,31}")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_arbitrary_text_is_accepted_only_when_it_is_a_valid_key(text: str) -> None:
    if _KEY_RE.fullmatch(text) is not None:
        assert check_plugin_key(text, "scheme") == text
    else:
        with pytest.raises(PluginSpecError):
            check_plugin_key(text, "scheme")


def test_join_settings_keeps_an_immutable_copy_of_options() -> None:
    source = {"region": "eu"}
    settings_ = JoinSettings(DatagramAddr.inproc(1, 2), options=source)
    source["region"] = "us"
    assert settings_.options == {"region": "eu"}
    with pytest.raises(TypeError):
        settings_.options["region"] = "us"  # type: ignore[index]
    again = JoinSettings(DatagramAddr.inproc(1, 2), options={"region": "eu"})
    assert hash(settings_) == hash(again)
    assert settings_ == again
    assert JoinSettings(DatagramAddr.inproc(1, 2)).options == {}


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(
        st.text(min_size=1, max_size=64), st.text(max_size=MAX_OPTION_VALUE_LENGTH), max_size=8
    )
)
def test_join_settings_options_equal_their_source(options: dict[str, str]) -> None:
    settings_ = JoinSettings(DatagramAddr.inproc(3, 4), PID, options)
    assert dict(settings_.options) == options
    assert settings_ == JoinSettings(DatagramAddr.inproc(3, 4), PID, dict(options))
    assert hash(settings_) == hash(JoinSettings(DatagramAddr.inproc(3, 4), PID, dict(options)))


def test_join_settings_and_identity_material_pickle_to_equal_values() -> None:
    values: list[object] = [
        JoinSettings(DatagramAddr.udp("127.0.0.1", 1), PID, {"a": "b"}),
        JoinSettings(DatagramAddr.inproc(1, 2)),
        IdentityMaterial(CERT_PEM, KEY_PEM, CERT_PEM),
    ]
    for value in values:
        for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
            assert pickle.loads(pickle.dumps(value, protocol)) == value


def test_frozen_records_cannot_be_changed() -> None:
    spec = CarrierSpec("udp", _open)
    with pytest.raises(AttributeError):
        spec.scheme = "tcp"  # type: ignore[misc]
    material = IdentityMaterial(CERT_PEM, KEY_PEM, CERT_PEM)
    with pytest.raises(AttributeError):
        material.key_pem = b""  # type: ignore[misc]


# -- malformed hook results ---------------------------------------------------------------


class ReturnsNone:
    @hookimpl
    def chrysalis_carriers(self) -> Sequence[CarrierSpec]:
        return None  # type: ignore[return-value]


class ReturnsWrongRecord:
    @hookimpl
    def chrysalis_carriers(self) -> Sequence[CarrierSpec]:
        return [IdentityProviderSpec("x", make_identity)]  # type: ignore[list-item]


class ReturnsTooMany:
    @hookimpl
    def chrysalis_carriers(self) -> Sequence[CarrierSpec]:
        return [CarrierSpec(f"s{i}", _open) for i in range(hookspecs.MAX_SPECS_PER_HOOK + 1)]


class ReturnsGenerator:
    @hookimpl
    def chrysalis_carriers(self) -> Sequence[CarrierSpec]:
        return (CarrierSpec(s, _open) for s in "ab")  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("plugin", "message"),
    [
        (ReturnsNone(), "must return a list or tuple, not NoneType"),
        (ReturnsGenerator(), "must return a list or tuple, not generator"),
        (ReturnsWrongRecord(), "returned a IdentityProviderSpec, not a CarrierSpec"),
        (ReturnsTooMany(), "returned 65 records, more than 64"),
    ],
)
def test_malformed_hook_results_name_the_plugin(
    registry: PluginRegistry, plugin: object, message: str
) -> None:
    registry.register(plugin, "bad")
    with pytest.raises(PluginSpecError, match=re.escape(message)) as info:
        registry.carriers()
    assert str(info.value).startswith("registered in code as bad: chrysalis_carriers ")


def test_hook_that_raises_is_a_load_error_chained_to_the_cause(registry: PluginRegistry) -> None:
    class Broken:
        @hookimpl
        def chrysalis_carriers(self) -> Sequence[CarrierSpec]:
            raise RuntimeError("boom")

    registry.register(Broken(), "broken")
    with pytest.raises(PluginLoadError, match="registered in code as broken failed") as info:
        registry.carriers()
    assert isinstance(info.value.__cause__, RuntimeError)


def test_misspelled_hook_is_refused_at_registration(registry: PluginRegistry) -> None:
    class Typo:
        @hookimpl
        def chrysalis_carrier(self) -> Sequence[CarrierSpec]:
            return []

    with pytest.raises(PluginSpecError, match="chrysalis_carrier"):
        registry.register(Typo(), "typo")
    assert registry.plugin_names() == ()
    registry.register(CarrierPlugin("a"), "typo")  # the name was not left taken


def test_optional_unknown_hook_is_accepted(registry: PluginRegistry) -> None:
    class FromTheFuture:
        @hookimpl(optionalhook=True)
        def chrysalis_teleporters(self) -> Sequence[object]:
            return []

        @hookimpl
        def chrysalis_carriers(self) -> Sequence[CarrierSpec]:
            return [CarrierSpec("a", _open)]

    registry.register(FromTheFuture(), "future")
    assert list(registry.carriers()) == ["a"]


def test_hook_with_unexpected_argument_is_refused(registry: PluginRegistry) -> None:
    class ExtraArgument:
        @hookimpl
        def chrysalis_carriers(self, config: object) -> Sequence[CarrierSpec]:
            return []

    with pytest.raises(PluginSpecError, match="config"):
        registry.register(ExtraArgument(), "extra")


def test_wrapper_implementations_are_refused(registry: PluginRegistry) -> None:
    class Wrapper:
        @hookimpl(wrapper=True)
        def chrysalis_carriers(self) -> Iterator[None]:
            yield

    with pytest.raises(PluginSpecError, match="wrappers are not supported"):
        registry.register(Wrapper(), "wrapper")
    assert registry.plugin_names() == ()


# -- the contract module ------------------------------------------------------------------


def _hookspec_functions() -> dict[str, Callable[..., object]]:
    marker = f"{hookspecs.PROJECT_NAME}_spec"
    return {
        name: value
        for name, value in vars(hookspecs).items()
        if inspect.isfunction(value) and hasattr(value, marker)
    }


def test_hookspecs_are_the_three_extension_points() -> None:
    assert sorted(_hookspec_functions()) == [
        "chrysalis_address_resolvers",
        "chrysalis_carriers",
        "chrysalis_identity_providers",
    ]
    assert hookspecs.PROJECT_NAME == hookspecs.ENTRY_POINT_GROUP == "chrysalis"


@pytest.mark.parametrize("name", sorted(_hookspec_functions()))
def test_every_hookspec_documents_its_contract(name: str) -> None:
    function = _hookspec_functions()[name]
    doc = inspect.getdoc(function)
    assert doc is not None
    assert "Contract:" in doc
    assert "conflict" in doc.lower() or "PluginConflictError" in doc
    assert name in hookspecs.__all__
    assert not inspect.signature(function).parameters  # no arguments: pure collection hooks
    opts = getattr(function, f"{hookspecs.PROJECT_NAME}_spec")
    assert opts["firstresult"] is False


def test_hookspec_module_is_accepted_by_pluggy() -> None:
    manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    manager.add_hookspecs(hookspecs)
    assert all(hasattr(manager.hook, name) for name in _hookspec_functions())


def test_hookspec_all_names_exist() -> None:
    for name in hookspecs.__all__:
        assert hasattr(hookspecs, name), name


# -- the process-wide registry ------------------------------------------------------------


def test_default_registry_loads_entry_points_once_across_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loads: list[PluginRegistry] = []
    entered = threading.Event()
    release = threading.Event()

    def slow_load(self: PluginRegistry) -> int:
        loads.append(self)
        entered.set()
        assert release.wait(timeout=5)
        return 0

    monkeypatch.setattr(PluginRegistry, "load_entry_points", slow_load)
    plugins_module._reset_default_registry()
    try:
        results: list[PluginRegistry] = []
        threads = [
            threading.Thread(target=lambda: results.append(default_registry())) for _ in range(4)
        ]
        for thread in threads:
            thread.start()
        assert entered.wait(timeout=5)
        release.set()
        for thread in threads:
            thread.join(timeout=5)
            assert not thread.is_alive()
        assert len(loads) == 1
        assert len(results) == 4
        assert all(result is loads[0] for result in results)
        assert default_registry() is loads[0]
    finally:
        plugins_module._reset_default_registry()


def test_default_registry_retries_after_a_failed_load(monkeypatch: pytest.MonkeyPatch) -> None:
    attempts: list[int] = []

    def flaky_load(self: PluginRegistry) -> int:
        attempts.append(1)
        if len(attempts) == 1:
            raise PluginLoadError("first attempt fails")
        return 0

    monkeypatch.setattr(PluginRegistry, "load_entry_points", flaky_load)
    plugins_module._reset_default_registry()
    try:
        with pytest.raises(PluginLoadError):
            default_registry()
        registry = default_registry()
        assert default_registry() is registry
        assert len(attempts) == 2
    finally:
        plugins_module._reset_default_registry()


# -- model-based: random register / unregister sequences ----------------------------------

_NAMES = ("p0", "p1", "p2", "p3")
_SCHEMES = ("a", "b", "c")


class RegistryMachine(RuleBasedStateMachine):
    """Registers and unregisters carrier plugins at random and checks the collected table
    (or the conflict) against a plain model after every step, exercising cache invalidation."""

    def __init__(self) -> None:
        super().__init__()
        self.registry = PluginRegistry()
        self.model: dict[str, tuple[str, ...]] = {}

    @rule(name=st.sampled_from(_NAMES), schemes=st.lists(st.sampled_from(_SCHEMES), max_size=2))
    def register(self, name: str, schemes: list[str]) -> None:
        plugin = CarrierPlugin(*schemes)
        if name in self.model:
            with pytest.raises(PluginConflictError):
                self.registry.register(plugin, name)
        else:
            assert self.registry.register(plugin, name) == name
            self.model[name] = tuple(schemes)

    @rule(name=st.sampled_from(_NAMES))
    def unregister(self, name: str) -> None:
        if name in self.model:
            self.registry.unregister(name=name)
            del self.model[name]
        else:
            with pytest.raises(ValueError):
                self.registry.unregister(name=name)

    @invariant()
    def table_matches_model(self) -> None:
        claimants: dict[str, list[str]] = {}
        for name, schemes in self.model.items():
            for scheme in schemes:
                claimants.setdefault(scheme, []).append(name)
        contested = {s: names for s, names in claimants.items() if len(names) > 1}
        if contested:
            with pytest.raises(PluginConflictError) as info:
                self.registry.carriers()
            assert info.value.key in contested
            owners = {f"registered in code as {n}" for n in contested[info.value.key]}
            assert set(info.value.owners) <= owners
        else:
            assert sorted(self.registry.carriers()) == sorted(claimants)
            for scheme in claimants:
                sock = self.registry.open_carrier(DatagramAddr(scheme, b""))
                assert isinstance(sock, FakeSocket)
                assert sock.scheme == scheme
        assert self.registry.plugin_names() == tuple(sorted(self.model))


RegistryMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=15, deadline=None)
TestRegistryMachine = RegistryMachine.TestCase

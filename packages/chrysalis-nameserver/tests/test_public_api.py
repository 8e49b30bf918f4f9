"""The public API of ``chrysalis.nameserver`` is exactly what the facade declares, and the
package stays sans-IO."""

from __future__ import annotations

import ast
import pickle
import pkgutil
from pathlib import Path

import chrysalis.nameserver
import chrysalis.nameserver.testing
from chrysalis.core import Pid
from chrysalis.nameserver import (
    ApplyError,
    ApplyErrorKind,
    Consistency,
    Labels,
    LocalProtocolError,
    ProcEntry,
    PublicationRejected,
    Resolve,
    SessionErrorKind,
)

PROTOCOL = {
    "DEFAULT_PAGE_LIMIT",
    "DEFAULT_VERSIONS",
    "FRAME_PREFIX_LEN",
    "MAX_ADDRESS_LEN",
    "MAX_ENTRIES_PER_FRAME",
    "MAX_FRAME_BODY",
    "MAX_LABELS",
    "MAX_LABELS_PER_ENTRY",
    "MAX_LOCATORS_PER_ENTRY",
    "MAX_PAGE_LIMIT",
    "MAX_REMOVALS_PER_FRAME",
    "MAX_SCHEME_LEN",
    "MAX_SERVER_NAME_LEN",
    "MIN_FRAME_BODY",
    "NS_PROTOCOL_SELECTOR",
    "SNAPSHOT_CHUNK_ENTRIES",
    "VERSION_1",
    "VERSION_2",
    "VERSION_3",
    "WIRE_VERSION",
    "CacheUpdate",
    "Consistency",
    "Delta",
    "Enumerate",
    "EnumerateResult",
    "EnumerationCursor",
    "EnumerationPage",
    "EnumerationResult",
    "EnumerationStale",
    "Found",
    "Hello",
    "Locator",
    "NotFound",
    "NsMessage",
    "ProcEntry",
    "PublicationAck",
    "Reject",
    "RejectCode",
    "ResnapshotRequired",
    "Resolution",
    "Resolve",
    "ResolveResult",
    "Revision",
    "SnapshotBegin",
    "SnapshotChunk",
    "SnapshotEnd",
    "VersionRange",
    "Welcome",
}
CODEC_AND_LABELS = {
    "DEFAULT_BUFFER_LIMIT",
    "NsCodec",
    "MAX_LABEL_KEY_LEN",
    "MAX_LABEL_NAME_LEN",
    "MAX_LABEL_PREFIX_LEN",
    "MAX_LABEL_VALUE_LEN",
    "Labels",
    "validate_label_key",
    "validate_label_value",
}
ERRORS = {
    "ApplyError",
    "ApplyErrorKind",
    "CacheError",
    "CacheErrorKind",
    "CodecError",
    "DecoderBufferFull",
    "FieldTooLarge",
    "FrameTooLarge",
    "InvalidAddress",
    "InvalidEnumValue",
    "InvalidFrameLength",
    "InvalidLabel",
    "InvalidUtf8",
    "InvalidVersionRange",
    "LabelError",
    "LabelErrorKind",
    "LocalProtocolError",
    "NameserverError",
    "PublicationRejected",
    "RemoteProtocolError",
    "RouteProjectionError",
    "SessionError",
    "SessionErrorKind",
    "TooManyItems",
    "TrailingBytes",
    "TruncatedFrame",
    "UnexpectedEof",
    "UnknownMessageTag",
    "UnsupportedWireVersion",
}
MACHINES = {
    "DEFAULT_CACHE_CAPACITY",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_ENTRIES",
    "DEFAULT_MAX_LINKS",
    "DEFAULT_MAX_PENDING_REQUESTS",
    "DEFAULT_NEGATIVE_TTL_MS",
    "MAX_IN_FLIGHT",
    "AdmitLink",
    "AppendSnapshotChunk",
    "ApplyDelta",
    "ApplyEffects",
    "BeginSnapshot",
    "CacheUpdated",
    "ChildEvent",
    "ChildPublisher",
    "ChildSession",
    "ChildState",
    "CommitCommand",
    "CommitSnapshot",
    "DirectoryChange",
    "DirectoryCommand",
    "EnumerateCompleted",
    "EnumerateForChild",
    "Established",
    "InstallRoute",
    "LinkIdAllocator",
    "LinkResponse",
    "LinkRoutePlan",
    "Nameserver",
    "ParentAction",
    "ParentSession",
    "ParentState",
    "PublicationAcked",
    "Rejected",
    "RemoveLink",
    "ResnapshotRequested",
    "ResolveCompleted",
    "ResolveForChild",
    "ResolverCache",
    "RouteAction",
    "RouteProjector",
    "RouteSession",
    "SendAndClose",
    "SendMessage",
    "WithdrawRoute",
    "clamp_page_limit",
    "entry_cost",
    "enumerate_local",
    "export_view",
    "lookup_local",
    "resolve_local",
    "rewrite_enumeration",
    "rewrite_resolution",
}
EXPECTED = PROTOCOL | CODEC_AND_LABELS | ERRORS | MACHINES
PACKAGE_DIR = Path(chrysalis.nameserver.__file__).parent
FORBIDDEN_IMPORTS = {"socket", "asyncio", "trio", "time", "selectors", "ssl", "aioquic"}


def test_facade_exports_exactly_the_public_api() -> None:
    assert set(chrysalis.nameserver.__all__) == EXPECTED
    assert len(chrysalis.nameserver.__all__) == len(EXPECTED)
    for name in EXPECTED:
        assert hasattr(chrysalis.nameserver, name), name


def test_public_classes_claim_the_facade_module() -> None:
    for name in chrysalis.nameserver.__all__:
        value = getattr(chrysalis.nameserver, name)
        if isinstance(value, type):
            assert value.__module__ == "chrysalis.nameserver", name


def test_modules_behind_the_facade_are_private() -> None:
    names = {info.name for info in pkgutil.iter_modules([str(PACKAGE_DIR)])}
    assert names - {"testing", "runtime"} == {n for n in names if n.startswith("_")}
    assert set(chrysalis.nameserver.testing.__all__) == {
        "DEFAULT_QUEUE_LIMIT",
        "ChildEnd",
        "ParentEnd",
        "SessionPair",
    }


def test_values_and_errors_pickle_by_facade_name() -> None:
    entry = ProcEntry(Pid(b"\x01" * 16), "n", Labels({"a": "b"}))
    message = Resolve(3, entry.pid, Consistency.REFRESH)
    assert pickle.loads(pickle.dumps(entry)) == entry
    assert pickle.loads(pickle.dumps(message)) == message
    assert b"chrysalis.nameserver._" not in pickle.dumps(message)
    rejected = PublicationRejected(ApplyError(ApplyErrorKind.WRONG_SNAPSHOT, "x"))
    again = pickle.loads(pickle.dumps(rejected))
    assert again.cause.kind is ApplyErrorKind.WRONG_SNAPSHOT
    local = LocalProtocolError(SessionErrorKind.CLOSED, "gone")
    assert str(pickle.loads(pickle.dumps(local))) == str(local)


# -- the asyncio I/O layer (appended with the service, links, server and manager) ------------

IO_LAYER = {
    "DEFAULT_READ_SIZE",
    "DEFAULT_REJOIN_GRACE",
    "DEFAULT_REJOIN_WAIT",
    "MAX_REJOINING",
    "DEFAULT_RETRY_DELAY",
    "DEFAULT_UPSTREAM_TIMEOUT",
    "ByteStream",
    "ChildLinkServer",
    "LinkState",
    "LinkStatus",
    "LocalEntryError",
    "MemoryByteStream",
    "NameserverService",
    "NamespaceConfig",
    "NsFrameStream",
    "ParentDialer",
    "ParentLink",
    "ParentLinkClosed",
    "ParentLinkError",
    "ParentLinkManager",
    "ParentLinkRejected",
    "ParentStatus",
    "ParentStatusKind",
    "StreamAcceptor",
    "TerminalRejection",
    "UpstreamClosed",
    "UpstreamNameserver",
    "Watch",
    "memory_stream_pair",
    "AsyncioSpawner",
    "Spawner",
    "Task",
    "TrioSpawner",
    "as_byte_stream",
}
EXPECTED |= IO_LAYER
IO_MODULES = {
    "_stream.py",
    "_service.py",
    "_link.py",
    "_server.py",
    "_manager.py",
    "runtime.py",
}

# The I/O modules (asyncio or trio, through ``runtime``) live beside the sans-IO core; the
# core alone must stay free of I/O.


def test_core_modules_never_import_io_or_clocks() -> None:
    checked = 0
    for path in PACKAGE_DIR.glob("*.py"):
        if path.name in IO_MODULES:
            continue
        checked += 1
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                roots = {(node.module or "").split(".")[0]}
            else:
                continue
            assert not roots & FORBIDDEN_IMPORTS, (path.name, roots)
    assert checked >= 10


def test_io_modules_import_no_sockets_or_quic() -> None:
    """Only ``runtime`` may touch trio (lazily); every other I/O module is runtime-neutral."""
    for name in IO_MODULES:
        forbidden = {"socket", "ssl", "aioquic", "time"}
        if name != "runtime.py":
            forbidden |= {"trio", "asyncio"}
        tree = ast.parse((PACKAGE_DIR / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom | ast.Import):
                names = (
                    [node.module or ""]
                    if isinstance(node, ast.ImportFrom)
                    else [a.name for a in node.names]
                )
                roots = {n.split(".")[0] for n in names}
                assert not roots & forbidden, (name, roots)

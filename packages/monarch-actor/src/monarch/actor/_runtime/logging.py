"""User logs and system logs, kept apart (Monarch 0.2.0: "system logs and user logs are
cleanly separated"; reference section 1.14).

Two kinds of log records exist in a Monarch process:

- **System logs**: the runtime's own, on loggers under ``monarch`` (``monarch.actor.runtime``,
  ``monarch.actor.worker``, ``monarch.supervision``, ...), and the transport's beneath them
  (``chrysalis.*``, aioquic's ``quic``). ``install_system_logging`` gives these loggers their
  own handlers and stops them from propagating, so they never reach the
  handlers the program installed on the root logger, and the program's log configuration never
  floods them: stderr at ``MONARCH_STDERR_LOG`` (default ``warning``; ``off`` for none), and a
  file at ``MONARCH_FILE_LOG`` (a level; default off) written to ``MONARCH_LOG_FILE``
  (default ``/tmp/$USER/monarch_log.log``). Each line names the process
  (``[monarch client] WARNING monarch.actor.runtime: ...``). A program that wants them in its
  own handlers sets ``logging.getLogger("monarch").propagate = True``.
- **User logs**: everything else, above all what actor code logs (``self.logger``, any
  ``logging.getLogger(...)``) and prints. They go where the program's logging configuration
  sends them. Records made inside an actor get the ``[actor=<instance chain>] `` prefix (on
  the client, outside any actor, ``[actor=<root>]``), added by a log-record factory so that
  every handler sees it, also handlers added later; empty messages are left alone, and
  ``monarch.actor.config.prefix_python_logs_with_actor = False`` turns it off. Each such record
  also carries the chain as ``record.actor`` for filters and structured formatters. Records
  of the system loggers are never prefixed.

User-visible faults travel as exceptions and supervision events (``monarch.supervision``
records), never as user-log noise.

Forwarding a worker's output to the client, sans-IO (the hosts layer does the reading and
writing): ``LinePrefixer`` turns arbitrary byte chunks into complete lines, each with a prefix
such as the rank's ``[1] `` (``rank_prefix``, Monarch's ``prefix_with_rank``), with lines bounded
to ``max_line`` bytes (longer ones are split) so a hostile or binary stream cannot grow memory
without bound; ``LineAggregator`` merges repeated lines within a time window
(``ProcMesh.logging_option(aggregate_window_sec=...)``), the time passed in by the caller, and
holds at most ``max_lines`` distinct lines and ``max_bytes`` bytes (it emits its window early
rather than grow).
"""

from __future__ import annotations

import getpass
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from monarch.actor import config
from monarch.actor._runtime.context import _current

__all__ = [
    "SYSTEM_LOGGER",
    "SIMILARITY",
    "LineAggregator",
    "LinePrefixer",
    "edit_distance",
    "install",
    "install_actor_log_prefix",
    "install_system_logging",
    "rank_prefix",
    "system_log_path",
    "uninstall_system_logging",
]

#: Root of the runtime's own loggers.
SYSTEM_LOGGER: Final = "monarch"
#: The loggers whose records are system logs: the runtime's, the transport's (``chrysalis.*``)
#: and aioquic's (``quic``, whose INFO records, such as each connection's close, would otherwise
#: reach the program's root handlers once it lowers the root level, as
#: ``logging_option(level=logging.INFO)`` does in every worker).
_SYSTEM_LOGGERS: Final = frozenset((SYSTEM_LOGGER, "chrysalis", "quic"))
_SYSTEM_PREFIXES: Final = tuple(f"{name}." for name in _SYSTEM_LOGGERS)
_LEVELS: Final = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}

_lock = threading.Lock()
_installed_label: str | None = None
_handlers: list[logging.Handler] = []
_levels_set: list[str] = []  # the system loggers whose level ``install_system_logging`` set
_factory_installed = False


def _level(name: str, default: int | None) -> int | None:
    raw = os.environ.get(name)
    if raw is None:
        return default
    text = raw.strip().lower()
    if text in ("", "off", "none", "0", "false"):
        return None
    if text.isdigit():
        return int(text)
    if text in _LEVELS:
        return _LEVELS[text]
    raise ValueError(f"{name}={raw!r} is not a log level (debug, info, warning, error, off)")


def system_log_path() -> Path:
    """Where the system log file goes: ``MONARCH_LOG_FILE`` or ``/tmp/$USER/monarch_log.log``."""
    explicit = os.environ.get("MONARCH_LOG_FILE")
    if explicit:
        return Path(explicit)
    try:
        user = getpass.getuser()
    except Exception:
        user = str(os.getuid())
    return Path("/tmp") / user / "monarch_log.log"


def install_system_logging(label: str) -> None:
    """Give the system loggers (``monarch``, ``chrysalis``, ``quic``) their own handlers (see
    the module docstring), naming this process ``label`` in each line; idempotent per process
    (the first label stays)."""
    global _installed_label
    with _lock:
        if _installed_label is not None:
            return
        _installed_label = label
        levels = []
        formatter = _SystemFormatter()
        stderr_level = _level("MONARCH_STDERR_LOG", logging.WARNING)
        if stderr_level is not None:
            handler: logging.Handler = logging.StreamHandler(sys.stderr)
            handler.setLevel(stderr_level)
            levels.append(stderr_level)
            _handlers.append(handler)
        file_level = _level("MONARCH_FILE_LOG", None)
        if file_level is not None:
            path = system_log_path()
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                handler = logging.FileHandler(path, encoding="utf-8")
            except OSError as exc:
                sys.stderr.write(f"monarch: cannot open the system log file {path}: {exc}\n")
            else:
                handler.setLevel(file_level)
                levels.append(file_level)
                _handlers.append(handler)
        if not _handlers:
            _handlers.append(logging.NullHandler())
        for handler in _handlers:
            handler.setFormatter(formatter)
        for name in _SYSTEM_LOGGERS:
            logger = logging.getLogger(name)
            for handler in _handlers:
                logger.addHandler(handler)
            if levels and logger.level == logging.NOTSET:
                logger.setLevel(min(levels))
                _levels_set.append(name)
            logger.propagate = False


def install(label: str) -> None:
    """Both halves: system-log handlers and the actor prefix on user logs (runtime hook, called
    when a process runtime starts; idempotent)."""
    if _installed_label is None:
        install_system_logging(label)
    if not _factory_installed:
        install_actor_log_prefix()


def uninstall_system_logging() -> None:
    """Undo ``install_system_logging``: a worker forked from the client's zygote inherits the
    client's handlers and its ``client`` label, and must install its own."""
    global _installed_label
    with _lock:
        if _installed_label is None:
            return
        for name in _SYSTEM_LOGGERS:
            logger = logging.getLogger(name)
            for handler in _handlers:
                logger.removeHandler(handler)
            logger.propagate = True
            if name in _levels_set:
                logger.setLevel(logging.NOTSET)
        for handler in _handlers:
            handler.close()
        _handlers.clear()
        _levels_set.clear()
        _installed_label = None


class _SystemFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("[monarch %(monarch_proc)s] %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        record.monarch_proc = _installed_label or "?"
        return super().format(record)


# ---------------------------------------------------------------------------------------------
# The actor prefix on user logs
# ---------------------------------------------------------------------------------------------
#: Hook: whether this OS process is running a Monarch client now (set by ``_runtime.client``
#: at import; ``None``: no client can exist yet).
_client_here: Callable[[], bool] | None = None


def set_client_probe(probe: Callable[[], bool]) -> None:
    """Register the check "this process runs a client" (once, at import, by the client
    runtime): records made outside any actor there are prefixed ``<root>``."""
    global _client_here
    _client_here = probe


def _chain_here() -> str | None:
    """The actor chain of the running code, ``<root>`` on the client, ``None`` elsewhere."""
    ctx = _current()
    if ctx is not None:
        return str(ctx.actor_instance)
    probe = _client_here
    if probe is not None and probe():
        return "<root>"
    return None


def install_actor_log_prefix() -> None:
    """Install the log-record factory that prefixes user records with ``[actor=<chain>] ``
    (idempotent; it keeps and calls whatever factory was installed before it)."""
    global _factory_installed
    with _lock:
        if _factory_installed:
            return
        previous = logging.getLogRecordFactory()

        def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = previous(*args, **kwargs)
            name = record.name
            if name in _SYSTEM_LOGGERS or name.startswith(_SYSTEM_PREFIXES):
                return record
            try:
                chain = _chain_here()
            except Exception:  # logging must never fail because of the prefix
                return record
            if chain is None:
                return record
            record.actor = chain

            msg = record.msg
            if config.prefix_python_logs_with_actor and isinstance(msg, str) and msg:
                prefix = f"[actor={chain}] "
                record.msg = (prefix.replace("%", "%%") if record.args else prefix) + msg
            return record

        logging.setLogRecordFactory(factory)
        _factory_installed = True


# ---------------------------------------------------------------------------------------------
# Forwarding a worker's output, sans-IO
# ---------------------------------------------------------------------------------------------
class LinePrefixer:
    """Turns byte chunks of one stream into prefixed, complete lines.

    ``feed(chunk)`` returns the lines completed by ``chunk`` (each ``prefix + line + b"\\n"``);
    ``flush()`` returns the unterminated tail, if any, at end of stream. A line longer than
    ``max_line`` bytes is emitted in ``max_line``-byte pieces, so at most ``max_line`` bytes are
    ever held.
    """

    __slots__ = ("_partial", "max_line", "prefix")

    def __init__(self, prefix: bytes, max_line: int = 64 * 1024) -> None:
        if max_line < 1:
            raise ValueError("max_line must be positive")
        self.prefix = prefix
        self.max_line = max_line
        self._partial = bytearray()

    def feed(self, chunk: bytes | bytearray | memoryview) -> list[bytes]:
        """The complete lines in ``chunk`` (plus what was held back), prefixed."""
        out: list[bytes] = []
        data = bytes(chunk)
        start = 0
        while start < len(data):
            end = data.find(b"\n", start)
            if end < 0:
                self._partial += data[start:]
                start = len(data)
            else:
                self._partial += data[start:end]
                start = end + 1
                out.extend(self._split(bytes(self._partial)))
                self._partial.clear()
            while len(self._partial) > self.max_line:
                piece = bytes(self._partial[: self.max_line])
                del self._partial[: self.max_line]
                out.append(self.prefix + piece + b"\n")
        return out

    def _split(self, line: bytes) -> list[bytes]:
        if len(line) <= self.max_line:
            return [self.prefix + line + b"\n"]
        return [
            self.prefix + line[i : i + self.max_line] + b"\n"
            for i in range(0, len(line), self.max_line)
        ]

    def flush(self) -> list[bytes]:
        """The held-back unterminated tail, terminated (end of stream)."""
        if not self._partial:
            return []
        tail = bytes(self._partial)
        self._partial.clear()
        return self._split(tail)


def rank_prefix(rank: int) -> bytes:
    """The prefix of a forwarded line of the worker at ``rank``, as Monarch writes it: ``[1] ``."""
    return b"[%d] " % rank


SIMILARITY: Final = 0.15
"""Monarch's threshold: lines whose normalized edit distance is below it are counted as one."""


class LineAggregator:
    """Merges repeated lines of one window of ``window`` seconds (sans-IO: ``now`` is passed in,
    Unix seconds).

    A window opens with the first line added; ``add(line, now)`` counts the line and returns
    what must be written now: nothing, or the previous window's block if ``now`` is past its end
    or it is full (``max_lines`` distinct lines or ``max_bytes`` bytes). As in Monarch, a line
    is counted under the held line it is most *similar* to: the one of smallest normalized edit
    distance (Levenshtein distance over the longer length; the first such line on a tie), if
    that is below ``similarity`` (Monarch's 0.15). Lines are compared whole, rank prefix and
    all, as Monarch does, so ``[1] step 11 loss 0.52`` merges into ``[0] step 10 loss 0.51``
    (3 edits in 21 bytes) and the same line of two ranks merges if it is at least 7 bytes long;
    ``similarity=0`` merges equal lines only.

    The search is bounded, so hostile output costs a bounded time a line: an equal line is
    found by hash, and so is a line seen before in the window (it counts where it counted
    first; at most ``max_lines`` such lines and ``max_bytes`` bytes are remembered); otherwise
    the line is compared with the held lines in the order they came until their lengths add up
    to ``compare_budget`` bytes, lines whose length alone puts them too far skipped without
    counting, and only if it and they are at most ``max_compared_bytes`` long (longer lines
    merge only when equal).

    ``deadline()`` is when the open window ends (None: no window open); ``poll(now)`` returns
    its block once that passed; ``flush(now)`` returns it at once (end of output, or
    aggregation turned off). A block is Monarch's: a header line, each line once in the order
    it first came, as ``[N similar log lines] LINE`` (the first one seen), and a footer line,
    with the window's start and end times.
    """

    __slots__ = (
        "_alias_bytes",
        "_aliases",
        "_bytes",
        "_lines",
        "_start",
        "compare_budget",
        "max_bytes",
        "max_compared_bytes",
        "max_lines",
        "similarity",
        "window",
    )

    def __init__(
        self,
        window: float,
        max_lines: int = 1024,
        max_bytes: int = 1 << 20,
        *,
        similarity: float = SIMILARITY,
        max_compared_bytes: int = 256,
        compare_budget: int = 1024,
    ) -> None:
        if window <= 0:
            raise ValueError("the aggregation window must be positive")
        if max_lines < 1 or max_bytes < 1:
            raise ValueError("max_lines and max_bytes must be positive")
        if not 0.0 <= similarity <= 1.0:
            raise ValueError(f"similarity must be within 0..1, got {similarity!r}")
        if max_compared_bytes < 0 or compare_budget < 0:
            raise ValueError("max_compared_bytes and compare_budget must not be negative")
        self.window = float(window)
        self.max_lines = max_lines
        self.max_bytes = max_bytes
        self.similarity = float(similarity)
        self.max_compared_bytes = max_compared_bytes
        self.compare_budget = compare_budget
        self._lines: dict[bytes, list[int]] = {}  # first line -> [count]
        self._aliases: dict[bytes, list[int]] = {}  # a similar line seen -> its entry
        self._bytes = 0
        self._alias_bytes = 0
        self._start: float | None = None

    def __len__(self) -> int:
        """Distinct lines held."""
        return len(self._lines)

    def deadline(self) -> float | None:
        """When the open window ends (None while none is open)."""
        return None if self._start is None else self._start + self.window

    def add(self, line: bytes, now: float) -> list[bytes]:
        """Count ``line`` (one line, with or without its newline); the lines to write now."""
        out = self.poll(now)
        line = line.rstrip(b"\n")
        entry = self._lines.get(line) or self._aliases.get(line)
        if entry is None and self.similarity > 0.0:
            entry = self._most_similar(line)
            if entry is not None and (
                len(self._aliases) < self.max_lines
                and self._alias_bytes + len(line) <= self.max_bytes
            ):
                self._aliases[line] = entry
                self._alias_bytes += len(line)
        if entry is not None:
            entry[0] += 1
            return out
        if len(self._lines) >= self.max_lines or self._bytes + len(line) > self.max_bytes:
            out += self.flush(now)
        if self._start is None:
            self._start = now
        self._lines[line] = [1]
        self._bytes += len(line)
        return out

    def _most_similar(self, line: bytes) -> list[int] | None:
        """The held entry nearest ``line`` below the similarity threshold, or None (bounded:
        ``compare_budget`` bytes of held lines compared, none over ``max_compared_bytes``)."""
        size = len(line)
        limit = self.max_compared_bytes
        if size > limit:
            return None
        budget = self.compare_budget
        best: list[int] | None = None
        best_distance = self.similarity
        for held, entry in self._lines.items():
            length = len(held)
            longer = max(size, length)
            if length > limit or longer == 0:
                continue
            # The distance is at least the lengths' difference: most lines skip the count.
            if abs(size - length) / longer >= best_distance:
                continue
            budget -= length
            if budget < 0:
                break
            distance = edit_distance(line, held) / longer
            if distance < best_distance:
                best, best_distance = entry, distance
        return best

    def poll(self, now: float) -> list[bytes]:
        """The open window's block if it ended by ``now``, else nothing."""
        deadline = self.deadline()
        if deadline is None or now < deadline:
            return []
        return self.flush(now)

    def flush(self, now: float) -> list[bytes]:
        """The open window's block now (nothing if no line is held); a new window opens with
        the next line."""
        if self._start is None:
            return []
        start, self._start = self._start, None
        lines, self._lines, self._bytes = self._lines, {}, 0
        self._aliases, self._alias_bytes = {}, 0
        out = [b">>> Aggregated Logs (%s) >>>\n" % _stamp(start)]
        out += [b"[%d similar log lines] %s\n" % (count, line) for line, (count,) in lines.items()]
        out.append(b"<<< Aggregated Logs (%s) <<<\n" % _stamp(now))
        return out


def edit_distance(a: bytes, b: bytes) -> int:
    """The Levenshtein distance of ``a`` and ``b`` (insertions, deletions and substitutions of
    one byte each), in O(len(a) + len(b)) big-integer operations: Myers' bit-parallel algorithm
    in Hyyrö's formulation, one bit of ``a`` a position (the pure-Python dynamic programme's
    ``len(a) * len(b)`` steps are some 30 times slower on 100-byte lines)."""
    if len(a) < len(b):
        a, b = b, a
    m = len(a)
    if not b:
        return m
    peq: dict[int, int] = {}
    for i, byte in enumerate(a):
        peq[byte] = peq.get(byte, 0) | (1 << i)
    full = (1 << m) - 1
    top = 1 << (m - 1)
    pv, mv, score = full, 0, m
    for byte in b:
        eq = peq.get(byte, 0)
        xv = eq | mv
        xh = (((eq & pv) + pv) ^ pv) | eq
        ph = mv | (~(xh | pv) & full)
        mh = pv & xh
        if ph & top:
            score += 1
        elif mh & top:
            score -= 1
        ph = ((ph << 1) | 1) & full
        mh = (mh << 1) & full
        pv = mh | (~(xv | ph) & full)
        mv = ph & xv
    return score


def _stamp(when: float) -> bytes:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when)).encode()

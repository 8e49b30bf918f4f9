"""Monarch's duration strings (``'5s'``, ``'1m 30s'``, ``'500ms'``): parse and format.

Why: Monarch 0.7.0 takes and returns every duration setting as a *humantime* string (the Rust
``humantime`` crate): ``configure(cleanup_timeout="90s")`` reads back as ``"1m 30s"``. Programs
compare those strings, so the parser and the formatter here follow that crate exactly: the same
unit names, the same canonical form, the same refusals. Pure: no clock, no I/O. Values are
whole nanoseconds (an ``int``), as Rust's ``Duration`` holds them.
"""

from __future__ import annotations

from typing import Final

__all__ = ["MAX_NANOS", "DurationError", "format_duration", "parse_duration"]

_NS: Final = 1
_US: Final = 1_000
_MS: Final = 1_000_000
_S: Final = 1_000_000_000
_MINUTE: Final = 60 * _S
_HOUR: Final = 3600 * _S
_DAY: Final = 86_400 * _S
_MONTH_S: Final = 2_630_016  # 30.44 days, humantime's month
_YEAR_S: Final = 31_557_600  # 365.25 days, humantime's year

#: The largest duration (Rust's ``Duration::MAX``), in nanoseconds.
MAX_NANOS: Final = (2**64 - 1) * _S + 999_999_999

# unit -> (nanoseconds, fraction base): a fraction of a unit must come out as whole nanoseconds
# (units up to minutes) or whole seconds (hours and longer), as humantime computes it.
_UNITS: Final[dict[str, tuple[int, int]]] = {
    **dict.fromkeys(("nanos", "nsec", "ns"), (_NS, _NS)),
    **dict.fromkeys(("usec", "us", "µs"), (_US, _NS)),
    **dict.fromkeys(("millis", "msec", "ms"), (_MS, _NS)),
    **dict.fromkeys(("seconds", "second", "secs", "sec", "s"), (_S, _NS)),
    **dict.fromkeys(("minutes", "minute", "min", "mins", "m"), (_MINUTE, _NS)),
    **dict.fromkeys(("hours", "hour", "hr", "hrs", "h"), (_HOUR, _S)),
    **dict.fromkeys(("days", "day", "d"), (_DAY, _S)),
    **dict.fromkeys(("weeks", "week", "wk", "wks", "w"), (7 * _DAY, _S)),
    **dict.fromkeys(("months", "month", "M"), (_MONTH_S * _S, _S)),
    **dict.fromkeys(("years", "year", "yr", "yrs", "y"), (_YEAR_S * _S, _S)),
}
_U64: Final = 2**64 - 1
_SUPPORTED: Final = (
    "ns, us/µs, ms, sec, min, hours, days, weeks, months, years (and few variations)"
)
_DIGITS: Final = frozenset("0123456789")
_SPACE: Final = frozenset(" \t\n\r\x0b\x0c")
_PRECISION: Final = (
    "number is too large or cannot be represented without a lack of precision "
    "(values below 1ns are not supported)"
)
#: Longest input accepted (a hostile string is refused before it is scanned).
MAX_TEXT: Final = 1024


class DurationError(ValueError):
    """A string that is not a duration; the message says where and why."""


def _fail(text: str, reason: str) -> DurationError:
    return DurationError(f"Invalid duration format {text!r}: {reason}")


def _digits(text: str, i: int) -> tuple[str, int]:
    """Digits from ``i`` on; whitespace between them is skipped (humantime reads "2 30ns" as
    230 ns)."""
    n = len(text)
    out: list[str] = []
    while i < n and (text[i] in _DIGITS or text[i] in _SPACE):
        if text[i] in _DIGITS:
            out.append(text[i])
        i += 1
    return "".join(out), i


def parse_duration(text: str) -> int:
    """Nanoseconds of a humantime string (``"1h 30m"``, ``"1.5s"``, ``"500ms"``, ``"0"``).

    Components are a decimal number and a unit, separated by optional whitespace, and add up
    (``"1s 1s"`` is 2 s). ``DurationError`` for anything else: no unit, an unknown unit, a
    negative or non-ASCII number, a fraction finer than the unit allows (below 1 ns; below 1 s
    for hours and longer), more than ``MAX_NANOS``.
    """
    if len(text) > MAX_TEXT:
        raise _fail(text[:32] + "...", f"longer than {MAX_TEXT} characters")
    if text == "0":
        return 0
    n = len(text)
    i = 0
    total = 0
    while i < n and text[i] in _SPACE:
        i += 1
    if i == n:
        raise _fail(text, "value was empty")
    while i < n:
        if text[i] not in _DIGITS:
            raise _fail(text, f"expected number at {i}")
        whole, i = _digits(text, i)
        fraction = ""
        if i < n and text[i] == ".":
            dot = i
            fraction, i = _digits(text, i + 1)
            if not fraction:
                raise _fail(text, f"invalid character at {i if i < n else dot}")
        begin = i
        while i < n and ((text[i].isascii() and text[i].isalpha()) or text[i] == "µ"):
            i += 1
        unit = text[begin:i]
        if not unit:
            if i < n:
                raise _fail(text, f"invalid character at {i}")
            number = int(whole)
            raise _fail(text, f"time unit needed, for example {number}sec or {number}ms")
        found = _UNITS.get(unit)
        if found is None:
            raise _fail(text, f'unknown time unit "{unit}", supported units: {_SUPPORTED}')
        scale, base = found
        if int(whole) > _U64 or int(whole) * (scale // _S or 1) > _U64:
            raise _fail(text, _PRECISION)
        total += int(whole) * scale
        if fraction:
            numerator = int(fraction) * (scale // base)
            denominator = 10 ** len(fraction)
            if numerator > _U64 or denominator > _U64 or numerator % denominator:
                raise _fail(text, _PRECISION)
            total += numerator // denominator * base
        if total > MAX_NANOS:
            raise _fail(text, _PRECISION)
        if i < n and text[i] not in _SPACE and text[i] not in _DIGITS:
            raise _fail(text, f"invalid character at {i}")
        while i < n and text[i] in _SPACE:
            i += 1
    return total


def format_duration(nanos: int) -> str:
    """Monarch's canonical string of ``nanos`` (``"1m 30s"``, ``"1s 500ms"``, ``"7days"``,
    ``"0s"``): years, months, days, h, m, s, ms, us, ns, zero parts left out."""
    if not 0 <= nanos <= MAX_NANOS:
        raise ValueError(f"a duration is 0 to {MAX_NANOS} ns, not {nanos}")
    if nanos == 0:
        return "0s"
    secs, sub = divmod(nanos, _S)
    years, rest = divmod(secs, _YEAR_S)
    months, rest = divmod(rest, _MONTH_S)
    days, rest = divmod(rest, 86_400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    millis, rest = divmod(sub, _MS)
    micros, ns = divmod(rest, _US)
    parts: list[str] = []
    for value, unit, plural in (
        (years, "year", True),
        (months, "month", True),
        (days, "day", True),
        (hours, "h", False),
        (minutes, "m", False),
        (seconds, "s", False),
        (millis, "ms", False),
        (micros, "us", False),
        (ns, "ns", False),
    ):
        if value:
            parts.append(f"{value}{unit}{'s' if plural and value > 1 else ''}")
    return " ".join(parts)

"""A subset of Go's ``text/template`` with a subset of sprig, for NTH's webhook templates.

aws-node-termination-handler renders WEBHOOK_TEMPLATE with Go's ``text/template`` and
``sprig.TxtFuncMap()`` (github.com/Masterminds/sprig/v3). No maintained Python library renders Go templates,
so this module implements the part NTH's users write, with Go's semantics, and refuses the rest when the
template is parsed (at start-up), with one line naming what is not supported. A template this module
accepts renders byte-for-byte as NTH renders it: ``tests/migration`` runs NTH's own webhook code beside it on
generated templates and data.

Supported (the Go documentation of package ``text/template`` describes each):

- text, actions ``{{ pipeline }}``, trim markers ``{{-`` / ``-}}``, comments ``{{/* … */}}``;
- ``if`` / ``else if`` / ``else`` / ``end``, ``with`` / ``else`` / ``end``, ``range`` (with ``$i, $v :=``,
  ``else``, ``break``, ``continue``), variables (``$x := …``, ``$x = …``, ``$``);
- fields (``.A.B``), literals (strings, raw strings, integers, ``true``, ``false``, ``nil``), pipelines with
  ``|``, parenthesised pipelines;
- Go's functions ``and or not eq ne lt le gt ge len index print printf println``;
- sprig's ``upper lower title trim trimPrefix trimSuffix trimAll replace quote squote default empty
  coalesce ternary join toJson toPrettyJson toString contains hasPrefix hasSuffix repeat nospace indent
  nindent list first last has sortAlpha splitList b64enc date now env``;
- the ``time.Time`` methods ``Format``, ``UTC``, ``Unix``, ``String`` and ``IsZero`` (``.StartTime``,
  ``.EndTime``).

Not supported (refused when parsed): ``define``, ``template``, ``block``, character constants, floats and
other sprig functions. ``printf`` takes the verbs ``%s %v %d %q %t %%``.

Data is a :class:`Struct` (a Go struct: a missing field is an error), with ``str``, ``bool``, ``int``,
``list`` (a Go slice), ``dict`` (a Go ``map[string]string``) and :class:`GoTime` values.
"""

from __future__ import annotations

import base64
import json
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

__all__ = ["GoTime", "NilMap", "NilSlice", "Struct", "Template", "TemplateError", "parse"]


class TemplateError(ValueError):
    """A template that cannot be parsed, uses what this module does not support, or fails to execute (Go's
    ``template: message:LINE: …`` errors); the message names the construct."""


class _Missing:
    """Go's invalid ``reflect.Value``: a map has no such key. It prints as ``<no value>``."""

    def __repr__(self) -> str:
        return "<no value>"


MISSING: Any = _Missing()


class Struct(dict[str, Any]):
    """A Go struct: its fields by name. Reading a field it does not have is an error, as in Go.
    ``json_names`` lists ``(JSON key, field)`` in the order ``encoding/json`` writes them (its tags and
    embedding rules applied; field ``""``: a shadowed string field, written empty); without it, the struct
    does not marshal (sprig's ``toJson`` gives "")."""

    def __init__(
        self, type_name: str, fields: Mapping[str, Any], json_names: Sequence[tuple[str, str]] = ()
    ) -> None:
        super().__init__(fields)
        self.type_name = type_name
        self.json_names = tuple(json_names)


class NilSlice(list[Any]):
    """A nil Go slice: prints as ``[]`` like an empty one, but marshals to JSON ``null``."""


class NilMap(dict[str, Any]):
    """A nil Go map: prints as ``map[]`` like an empty one, but marshals to JSON ``null``."""


# ---------------------------------------------------------------------------------------------------- time

_MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


@dataclass(frozen=True)
class GoTime:
    """A Go ``time.Time``: an aware datetime, nanoseconds beyond its microseconds, the zone abbreviation
    Go would print (``UTC`` for UTC, else empty: a fixed offset prints as ``+0100``) and, for a time read
    from Go's ``time.Now()``, the monotonic clock reading ``String()`` appends (``m=+12.345678901``)."""

    moment: datetime
    nanos: int = 0
    zone: str | None = None
    monotonic: float | None = None

    @classmethod
    def zero(cls) -> GoTime:
        """Go's zero ``time.Time``: January 1, year 1, 00:00:00 UTC."""
        return cls(datetime(1, 1, 1, tzinfo=UTC))

    @property
    def nanosecond(self) -> int:
        """The fraction of the second in nanoseconds."""
        return self.moment.microsecond * 1000 + self.nanos

    def abbreviation(self) -> str:
        """The zone name Go prints for ``MST``: the abbreviation, or ``-0700`` when the zone has none (a
        fixed offset)."""
        if self.zone is not None:
            return self.zone
        name = self.moment.tzname() or ""
        if name.isalpha():
            return name
        return _offset(self.moment.utcoffset() or timedelta(0), colon=False, seconds=False)

    def format(self, layout: str) -> str:
        """``time.Time.Format(layout)``: Go's reference-time layout (``2006-01-02T15:04:05Z07:00``)."""
        return _format(self, layout)

    def utc(self) -> GoTime:
        """``time.Time.UTC()`` (the monotonic reading is dropped, as Go does)."""
        return GoTime(self.moment.astimezone(UTC), self.nanos, "UTC")

    def unix(self) -> int:
        """``time.Time.Unix()``: whole seconds since 1970-01-01 UTC (rounded down)."""
        delta = self.moment - datetime(1970, 1, 1, tzinfo=UTC)
        return delta.days * 86400 + delta.seconds

    def is_zero(self) -> bool:
        """``time.Time.IsZero()``."""
        return self.moment == datetime(1, 1, 1, tzinfo=UTC) and self.nanos == 0

    def __str__(self) -> str:
        text = self.format("2006-01-02 15:04:05.999999999 -0700 MST")
        if self.monotonic is not None:
            seconds, nanos = divmod(round(abs(self.monotonic) * 1e9), 10**9)
            text += f" m={'-' if self.monotonic < 0 else '+'}{seconds}.{nanos:09d}"
        return text


def _offset(offset: timedelta, *, colon: bool, seconds: bool) -> str:
    """``offset`` as Go prints ``-0700`` (``colon``: ``-07:00``; ``seconds``: ``-07:00:00``)."""
    total = int(offset.total_seconds())
    sign = "-" if total < 0 else "+"
    hours, rest = divmod(abs(total), 3600)
    minutes, secs = divmod(rest, 60)
    sep = ":" if colon else ""
    text = f"{sign}{hours:02d}{sep}{minutes:02d}"
    return text + f"{sep}{secs:02d}" if seconds else text


_STD = re.compile(
    r"January|Jan(?![a-z])|Monday|Mon(?![a-z])|MST|0[1-6]|002|15|1|2006|_2006|__2|_2|2|3|4|5|PM|pm"
    r"|-070000|-07:00:00|-0700|-07:00|-07|Z070000|Z07:00:00|Z0700|Z07:00|Z07|[.,](?:0+|9+)(?![0-9])"
)


def _format(t: GoTime, layout: str) -> str:
    """Go's ``time.Time.Format``: each chunk of the reference time ``Mon Jan 2 15:04:05 MST 2006`` in
    ``layout`` is replaced by ``t``'s value (the chunks Go's ``nextStdChunk`` recognises, in its order)."""
    m = t.moment
    out: list[str] = []
    pos = 0
    for match in _STD.finditer(layout):
        out.append(layout[pos : match.start()])
        pos = match.end()
        chunk = match.group()
        if chunk == "_2006":
            out.append("_" + _year(m.year, 4))
            continue
        out.append(_chunk(t, chunk))
    out.append(layout[pos:])
    return "".join(out)


def _year(year: int, width: int) -> str:
    return f"{year:0{width}d}"


def _chunk(t: GoTime, chunk: str) -> str:
    m = t.moment
    offset = m.utcoffset() or timedelta(0)
    hour12 = m.hour % 12 or 12
    if chunk[0] in ".," and len(chunk) > 1:
        digits = f"{t.nanosecond:09d}"[: len(chunk) - 1]
        if chunk[1] == "9":
            digits = digits.rstrip("0")
            return chunk[0] + digits if digits else ""
        return chunk[0] + digits
    if chunk.startswith("Z") and offset == timedelta(0):
        return "Z"
    match chunk:
        case "January":
            return _MONTHS[m.month - 1]
        case "Jan":
            return _MONTHS[m.month - 1][:3]
        case "Monday":
            return _DAYS[m.weekday()]
        case "Mon":
            return _DAYS[m.weekday()][:3]
        case "MST":
            return t.abbreviation()
        case "01":
            return f"{m.month:02d}"
        case "02":
            return f"{m.day:02d}"
        case "03":
            return f"{hour12:02d}"
        case "04":
            return f"{m.minute:02d}"
        case "05":
            return f"{m.second:02d}"
        case "06":
            return f"{m.year % 100:02d}"
        case "002":
            return f"{m.timetuple().tm_yday:03d}"
        case "__2":
            return f"{m.timetuple().tm_yday:>3d}"
        case "15":
            return f"{m.hour:02d}"
        case "1":
            return str(m.month)
        case "2006":
            return _year(m.year, 4)
        case "_2":
            return f"{m.day:>2d}"
        case "2":
            return str(m.day)
        case "3":
            return str(hour12)
        case "4":
            return str(m.minute)
        case "5":
            return str(m.second)
        case "PM":
            return "PM" if m.hour >= 12 else "AM"
        case "pm":
            return "pm" if m.hour >= 12 else "am"
        case "-070000" | "Z070000":
            return _offset(offset, colon=False, seconds=True)
        case "-07:00:00" | "Z07:00:00":
            return _offset(offset, colon=True, seconds=True)
        case "-0700" | "Z0700":
            return _offset(offset, colon=False, seconds=False)
        case "-07:00" | "Z07:00":
            return _offset(offset, colon=True, seconds=False)
        case _:  # "-07" | "Z07"
            return _offset(offset, colon=False, seconds=False)[:3]


# ---------------------------------------------------------------------------------------------- printing


def printed(value: Any) -> str:
    """``fmt.Sprint`` of one value, as ``text/template`` prints an action's result."""
    if value is MISSING:
        return "<no value>"
    if value is None:
        return "<nil>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return str(value)
    if isinstance(value, GoTime):
        return str(value)
    if isinstance(value, Struct):
        return "{" + " ".join(printed(v) for v in value.values()) + "}"
    if isinstance(value, dict):
        return "map[" + " ".join(f"{printed(k)}:{printed(value[k])}" for k in sorted(value)) + "]"
    if isinstance(value, list | tuple):
        return "[" + " ".join(printed(v) for v in value) + "]"
    return str(value)


def go_quote(text: str) -> str:
    """``strconv.Quote``: a double-quoted Go string literal; printable characters kept, others escaped."""
    out = ['"']
    for char in text:
        code = ord(char)
        if char in '"\\':
            out.append("\\" + char)
        elif char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif char.isprintable() or char == " ":
            out.append(char)
        elif code < 0x80:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}


def _sprint(args: Sequence[Any]) -> str:
    """``fmt.Sprint``: a space between two operands when neither is a string."""
    out: list[str] = []
    for i, arg in enumerate(args):
        if i > 0 and not isinstance(arg, str) and not isinstance(args[i - 1], str):
            out.append(" ")
        out.append(printed(arg))
    return "".join(out)


_VERB = re.compile(r"%(%|[-+# 0]*[0-9]*[a-zA-Z])")


def _sprintf(fmt: str, *args: Any) -> str:
    """``fmt.Sprintf`` for the verbs ``%s %v %d %q %t %%`` (no width or flags)."""
    values = iter(args)

    def verb(match: re.Match[str]) -> str:
        spec = match.group(1)
        if spec == "%":
            return "%"
        if len(spec) != 1 or spec not in "svdqt":
            raise TemplateError(f"printf verb %{spec} is not supported (only %s %v %d %q %t %%)")
        try:
            value = next(values)
        except StopIteration:
            return f"%!{spec}(MISSING)"
        if value is None:
            return "<nil>" if spec == "v" else f"%!{spec}(<nil>)"
        if spec == "q" and isinstance(value, str):
            return go_quote(value)
        if spec == "d" and (not isinstance(value, int) or isinstance(value, bool)):
            return f"%!d({_type_name(value)}={printed(value)})"
        if spec == "t" and not isinstance(value, bool):
            return f"%!t({_type_name(value)}={printed(value)})"
        if spec == "s" and not isinstance(value, str | GoTime | list | dict):
            return f"%!s({_type_name(value)}={printed(value)})"
        return printed(value)

    text = _VERB.sub(verb, fmt)
    extra = list(values)
    if extra:
        text += "%!(EXTRA " + ", ".join(f"{_type_name(v)}={printed(v)}" for v in extra) + ")"
    return text


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, str):
        return "string"
    if isinstance(value, GoTime):
        return "time.Time"
    if isinstance(value, Struct):
        return value.type_name
    if isinstance(value, dict):
        return "map[string]string"
    if isinstance(value, list):
        return "[]string" if all(isinstance(v, str) for v in value) else "[]interface {}"
    return "<nil>"


# --------------------------------------------------------------------------------------------- functions


def truth(value: Any) -> bool:
    """Go's ``text/template`` truth: false, 0, nil, no value and empty strings, slices and maps are
    false; a struct (a time) is true."""
    if value is MISSING or value is None:
        return False
    if isinstance(value, GoTime | Struct):
        return True
    return bool(value)


def _empty(value: Any) -> bool:
    """sprig's ``empty``: like :func:`truth` negated, but a time is not empty either."""
    return not truth(value)


def _string(value: Any, what: str) -> str:
    if value is MISSING:
        raise TemplateError(f"invalid value; expected string for {what}")
    if not isinstance(value, str):
        raise TemplateError(f"wrong type for value; expected string; got {_type_name(value)} for {what}")
    return value


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TemplateError(f"wrong type for value; expected int; got {_type_name(value)} for {what}")
    return value


def _strval(value: Any) -> str:
    """sprig's ``strval``: a string as it is, anything else as ``%v`` prints it."""
    if value is MISSING:
        return "<nil>"
    return value if isinstance(value, str) else printed(value)


def _strslice(value: Any) -> list[str]:
    """sprig's ``strslice``: the strings of a slice (nil elements dropped), or one value as a slice."""
    if value is MISSING or value is None:
        return []
    if isinstance(value, list):
        return [_strval(v) for v in value if v is not None and v is not MISSING]
    return [_strval(value)]


def _go_json(value: Any, indent: bool) -> str:
    """``encoding/json`` (``json.Marshal`` / ``MarshalIndent(v, "", "  ")``): map keys sorted, ``<``, ``>``
    and ``&`` escaped as Go escapes them for HTML safety, times as RFC 3339 with nanoseconds."""

    def plain(v: Any) -> Any:
        if isinstance(v, GoTime):
            return v.format("2006-01-02T15:04:05.999999999Z07:00")
        if v is MISSING or isinstance(v, NilSlice | NilMap):
            return None
        if isinstance(v, Struct):
            return {key: plain(v[name]) if name else "" for key, name in v.json_names}
        if isinstance(v, dict):
            return {k: plain(v[k]) for k in sorted(v)}
        if isinstance(v, list):
            return [plain(x) for x in v]
        return v

    if isinstance(value, Struct) and not value.json_names:
        return ""
    if indent:
        text = json.dumps(plain(value), ensure_ascii=False, indent=2)
    else:
        text = json.dumps(plain(value), ensure_ascii=False, separators=(",", ":"))
    for char, escaped in (
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("&", "\\u0026"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(char, escaped)
    return text


#: The characters Go's ``unicode.IsSpace`` reports (``strings.TrimSpace``, sprig's ``nospace``).
_GO_SPACE = (
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)


def _nospace(text: str) -> str:
    """sprig's ``nospace`` (goutils ``DeleteWhiteSpace``), bug for bug: it reads the UTF-8 bytes one by one
    as runes, so each byte is written back as its Latin-1 character, and bytes 0x85 and 0xA0 (inside any
    multi-byte character) are dropped as spaces; a string with no space byte is returned as it is."""
    raw = text.encode()
    kept = [chr(b) for b in raw if chr(b) not in _GO_SPACE]
    return text if len(kept) == len(raw) else "".join(kept)


def _separator(char: str) -> bool:
    """Go's ``strings.isSeparator`` (``strings.Title``)."""
    if char <= "\x7f":
        return not (char.isascii() and (char.isalnum() or char == "_"))
    if char.isalpha() or char.isdigit():
        return False
    return char in _GO_SPACE


def _title(text: str) -> str:
    """``strings.Title``: the first letter of each word upper-cased (the rest left as it is)."""
    out: list[str] = []
    previous = " "
    for char in text:
        out.append(char.upper() if _separator(previous) else char)
        previous = char
    return "".join(out)


def _eq(a: Any, *others: Any) -> bool:
    if not others:
        raise TemplateError("missing argument for comparison")
    return any(_compare_eq(a, b) for b in others)


def _basic(value: Any) -> str:
    """Go's basic kind for comparisons: ``bool``, ``int``, ``string``, ``nil`` or ``other``."""
    if value is None or value is MISSING:
        return "nil"
    name = _type_name(value)
    return name if name in ("bool", "int", "string") else "other"


def _compare_eq(a: Any, b: Any) -> bool:
    ka, kb = _basic(a), _basic(b)
    if ka == "nil" or kb == "nil":
        return ka == kb
    if ka == "other" or kb == "other":
        raise TemplateError("uncomparable type in comparison")
    if ka != kb:
        raise TemplateError("incompatible types for comparison")
    return bool(a == b)


def _lt(a: Any, b: Any) -> bool:
    ka, kb = _basic(a), _basic(b)
    if ka not in ("int", "string") or ka != kb:
        raise TemplateError(
            "invalid type for comparison" if ka == kb else "incompatible types for comparison"
        )
    return bool(a < b)


def _len(value: Any) -> int:
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, list | dict) and not isinstance(value, Struct):
        return len(value)
    raise TemplateError(f"len of type {_type_name(value)}")


def _index(item: Any, *indices: Any) -> Any:
    for key in indices:
        if isinstance(item, dict) and not isinstance(item, Struct):
            item = item.get(_string(key, "index"), "")
        elif isinstance(item, list | str):
            position = _int(key, "index")
            if not 0 <= position < len(item):
                raise TemplateError(f"index out of range: {position}")
            item = item[position] if isinstance(item, list) else item.encode()[position]
        else:
            raise TemplateError(f"can't index item of type {_type_name(item)}")
    return item


def _bool(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise TemplateError(f"wrong type for value; expected bool; got {_type_name(value)} for {what}")
    return value


def _count(value: Any, what: str) -> int:
    """A repeat count (``strings.Repeat`` panics on a negative one: an error here)."""
    count = _int(value, what)
    if count < 0:
        raise TemplateError(f"negative count for {what}")
    return count


def _indent(spaces: int, text: str) -> str:
    pad = " " * spaces
    return pad + text.replace("\n", "\n" + pad)


def _split(sep: str, text: str) -> list[str]:
    """``strings.Split``: an empty separator splits after each character."""
    return list(text) if sep == "" else text.split(sep)


def _default(default: Any, *given: Any) -> Any:
    if not given or _empty(given[0]):
        return default
    return given[0]


def _has(needle: Any, haystack: Any) -> bool:
    if haystack is None or haystack is MISSING:
        return False
    if not isinstance(haystack, list):
        raise TemplateError(f"cannot find has on type {_type_name(haystack)}")
    return any(_basic(needle) == _basic(v) and v == needle for v in haystack)


def _date(layout: str, moment: Any) -> str:
    if isinstance(moment, GoTime):
        local = moment.moment.astimezone()
        return GoTime(local, moment.nanos).format(_string(layout, "date"))
    if isinstance(moment, int) and not isinstance(moment, bool):
        local = datetime.fromtimestamp(moment, UTC).astimezone()
        return GoTime(local).format(_string(layout, "date"))
    return GoTime(datetime.now().astimezone()).format(_string(layout, "date"))


def _first(value: Any) -> Any:
    if value is None or value is MISSING:
        return None
    if not isinstance(value, list):
        raise TemplateError(f"cannot find first on type {_type_name(value)}")
    return value[0] if value else None


def _last(value: Any) -> Any:
    if value is None or value is MISSING:
        return None
    if not isinstance(value, list):
        raise TemplateError(f"cannot find last on type {_type_name(value)}")
    return value[-1] if value else None


def _now() -> GoTime:
    return GoTime(datetime.now().astimezone(), monotonic=_monotonic())


#: Go's monotonic clock starts with the process: ``m=+…`` in a ``time.Now()`` value counts from here.
PROCESS_START = time.monotonic()


def _monotonic() -> float:
    return time.monotonic() - PROCESS_START


def _and(*args: Any) -> Any:  # the evaluator short-circuits; this is for a pipeline's last value
    for arg in args:
        if not truth(arg):
            return arg
    return args[-1]


def _or(*args: Any) -> Any:
    for arg in args:
        if truth(arg):
            return arg
    return args[-1]


#: The functions a template may call: Go's builtins and the sprig functions this module implements, each
#: with sprig's argument order (a pipeline's value is passed last).
FUNCTIONS: dict[str, Callable[..., Any]] = {
    # Go's text/template builtins
    "and": _and,
    "or": _or,
    "not": lambda value: not truth(value),
    "eq": _eq,
    "ne": lambda a, b: not _compare_eq(a, b),
    "lt": _lt,
    "le": lambda a, b: _lt(a, b) or _compare_eq(a, b),
    "gt": lambda a, b: not (_lt(a, b) or _compare_eq(a, b)),
    "ge": lambda a, b: not _lt(a, b),
    "len": _len,
    "index": _index,
    "print": lambda *args: _sprint(args),
    "printf": lambda fmt, *args: _sprintf(_string(fmt, "printf"), *args),
    "println": lambda *args: " ".join(printed(a) for a in args) + "\n",
    # sprig (github.com/Masterminds/sprig/v3, TxtFuncMap)
    "upper": lambda s: _string(s, "upper").upper(),
    "lower": lambda s: _string(s, "lower").lower(),
    "title": lambda s: _title(_string(s, "title")),
    "trim": lambda s: _string(s, "trim").strip(_GO_SPACE),
    "trimPrefix": lambda p, s: _string(s, "trimPrefix").removeprefix(_string(p, "trimPrefix")),
    "trimSuffix": lambda p, s: _string(s, "trimSuffix").removesuffix(_string(p, "trimSuffix")),
    "trimAll": lambda cut, s: _string(s, "trimAll").strip(_string(cut, "trimAll")),
    "replace": lambda old, new, s: _string(s, "replace").replace(
        _string(old, "replace"), _string(new, "replace")
    ),
    "quote": lambda *a: " ".join(go_quote(_strval(v)) for v in a if v is not None and v is not MISSING),
    "squote": lambda *a: " ".join(f"'{_strval(v)}'" for v in a if v is not None and v is not MISSING),
    "default": _default,
    "empty": _empty,
    "coalesce": lambda *a: next((v for v in a if not _empty(v)), None),
    "ternary": lambda yes, no, test: yes if _bool(test, "ternary") else no,
    "join": lambda sep, v: _string(sep, "join").join(_strslice(v)),
    "toJson": lambda v: _go_json(v, indent=False),
    "toPrettyJson": lambda v: _go_json(v, indent=True),
    "toString": _strval,
    "contains": lambda sub, s: _string(sub, "contains") in _string(s, "contains"),
    "hasPrefix": lambda p, s: _string(s, "hasPrefix").startswith(_string(p, "hasPrefix")),
    "hasSuffix": lambda p, s: _string(s, "hasSuffix").endswith(_string(p, "hasSuffix")),
    "repeat": lambda n, s: _string(s, "repeat") * _count(n, "repeat"),
    "nospace": lambda s: _nospace(_string(s, "nospace")),
    "indent": lambda n, s: _indent(_count(n, "indent"), _string(s, "indent")),
    "nindent": lambda n, s: "\n" + _indent(_count(n, "nindent"), _string(s, "nindent")),
    "list": lambda *a: list(a),
    "first": _first,
    "last": _last,
    "has": _has,
    "sortAlpha": lambda v: sorted(_strslice(v)),
    "splitList": lambda sep, s: _split(_string(sep, "splitList"), _string(s, "splitList")),
    "b64enc": lambda s: base64.b64encode(_string(s, "b64enc").encode()).decode(),
    "date": _date,
    "now": _now,
    "env": lambda name: os.environ.get(_string(name, "env"), ""),
}

#: Methods of ``time.Time`` a template may call on ``.StartTime`` and ``.EndTime``.
TIME_METHODS: dict[str, Callable[..., Any]] = {
    "Format": lambda t, layout: t.format(_string(layout, "Format")),
    "UTC": GoTime.utc,
    "Unix": GoTime.unix,
    "String": str,
    "IsZero": GoTime.is_zero,
}

# ----------------------------------------------------------------------------------------------- lexing

_TOKEN = re.compile(
    r"""(?P<space>\s+)
      |(?P<string>"(?:[^"\\\n]|\\.)*")
      |(?P<raw>`[^`]*`)
      |(?P<char>'(?:[^'\\\n]|\\.)*')
      |(?P<number>[-+]?(?:0[xX][0-9a-fA-F_]+|0[oO][0-7_]+|0[bB][01_]+|[0-9][0-9_]*(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)?|\.[0-9]+(?:[eE][-+]?[0-9]+)?)(?![A-Za-z_.]))
      |(?P<field>\.[A-Za-z_][A-Za-z0-9_]*)
      |(?P<dot>\.)
      |(?P<variable>\$[A-Za-z0-9_]*)
      |(?P<declare>:=)
      |(?P<assign>=)
      |(?P<pipe>\|)
      |(?P<lparen>\()
      |(?P<rparen>\))
      |(?P<comma>,)
      |(?P<identifier>[A-Za-z_][A-Za-z0-9_]*)
    """,
    re.VERBOSE,
)

_GO_ESCAPES = {
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    '"': '"',
}


def _unquote(literal: str) -> str:
    """A Go interpreted string literal's value (``strconv.Unquote``)."""
    body = literal[1:-1]
    out: list[str] = []
    i = 0
    while i < len(body):
        char = body[i]
        if char != "\\":
            out.append(char)
            i += 1
            continue
        code = body[i + 1]
        if code in _GO_ESCAPES:
            out.append(_GO_ESCAPES[code])
            i += 2
        elif code == "x":
            out.append(chr(int(body[i + 2 : i + 4], 16)))
            i += 4
        elif code in "uU":
            width = 4 if code == "u" else 8
            out.append(chr(int(body[i + 2 : i + 2 + width], 16)))
            i += 2 + width
        elif code in "01234567":
            out.append(chr(int(body[i + 1 : i + 4], 8)))
            i += 4
        else:
            raise TemplateError(f"unknown escape sequence \\{code} in {literal}")
    return "".join(out)


@dataclass
class _Token:
    kind: str
    text: str
    line: int


def _lex_action(text: str, line: int) -> list[_Token]:
    tokens: list[_Token] = []
    pos = 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            raise TemplateError(f"template: message:{line}: unexpected {text[pos]!r} in action")
        kind = match.lastgroup or ""
        value = match.group()
        if kind == "char":
            raise TemplateError(f"template: message:{line}: character constants are not supported")
        if kind == "number" and not re.fullmatch(r"[-+]?[0-9][0-9_]*|[-+]?0[xX][0-9a-fA-F_]+", value):
            raise TemplateError(f"template: message:{line}: number {value} is not supported (integers only)")
        if kind != "space":
            tokens.append(_Token(kind, value, line + text.count("\n", 0, pos)))
        elif text[match.end() :][:1] == ".":
            tokens.append(_Token("space", value, line))  # ends a field chain: "$x .A" is two operands
        pos = match.end()
    return tokens


# ------------------------------------------------------------------------------------------------ nodes


@dataclass
class _Operand:
    """One argument: a literal, a function name, ``.``, a variable or a parenthesised pipeline, then the
    fields read on it (``(…).A.B``, ``$x.A``)."""

    kind: str  # "literal" | "function" | "dot" | "variable" | "pipeline"
    value: Any = None
    fields: list[str] = field(default_factory=list)
    line: int = 1


@dataclass
class _Command:
    operands: list[_Operand]


@dataclass
class _Pipeline:
    commands: list[_Command]
    declare: list[str] = field(default_factory=list)
    assign: bool = False
    line: int = 1


@dataclass
class _Text:
    text: str


@dataclass
class _Action:
    pipeline: _Pipeline


@dataclass
class _Branch:
    """``if``, ``with`` or ``range``: its pipeline, the body, and what ``else`` runs."""

    keyword: str
    pipeline: _Pipeline
    body: list[Any]
    otherwise: list[Any]


@dataclass
class _Loop:
    keyword: str  # "break" | "continue"


class _Break(Exception):  # noqa: N818 - control flow, not an error
    pass


class _Continue(Exception):  # noqa: N818 - control flow, not an error
    pass


_UNSUPPORTED_KEYWORDS = {"define", "template", "block"}


class _Parser:
    def __init__(self, source: str) -> None:
        self.source = source
        self.items = list(self._split(source))
        self.pos = 0
        self.loops = 0
        self.variables: list[set[str]] = [{"$"}]

    @staticmethod
    def _split(source: str) -> Iterator[tuple[str, str, int]]:
        """``("text", text, line)`` and ``("action", inside, line)`` items, trim markers applied."""
        pos = 0
        line = 1
        trim_next = False
        while True:
            start = source.find("{{", pos)
            text = source[pos:] if start < 0 else source[pos:start]
            if trim_next:
                text = text.lstrip(" \t\r\n")
            if start < 0:
                if text:
                    yield ("text", text, line)
                return
            inner_start = start + 2
            trim_left = source[inner_start : inner_start + 1] == "-" and source[
                inner_start + 1 : inner_start + 2
            ] in (
                " ",
                "\t",
                "\r",
                "\n",
            )
            if trim_left:
                text = text.rstrip(" \t\r\n")
                inner_start += 2
            if text:
                yield ("text", text, line)
            line += source.count("\n", pos, start)
            comment = source.startswith("/*", inner_start)
            if comment:
                close = source.find("*/", inner_start + 2)
                if close < 0:
                    raise TemplateError(f"template: message:{line}: unclosed comment")
                after = close + 2
                trim_next = source.startswith(" -}}", after)
                if not trim_next and not source.startswith("}}", after):
                    raise TemplateError(f"template: message:{line}: comment ends before closing delimiter")
                end = after + (4 if trim_next else 2)
                line += source.count("\n", start, end)
                pos = end
                continue
            end = _action_end(source, inner_start, line)
            inner = source[inner_start:end]
            trim_next = inner.endswith((" -", "\t-", "\n-", "\r-"))
            if trim_next:
                inner = inner[:-2]
            yield ("action", inner, line)
            line += source.count("\n", start, end + 2)
            pos = end + 2

    def parse(self) -> list[Any]:
        nodes, stop = self._list()
        if stop is not None:
            raise TemplateError(f"template: message:{stop[1]}: unexpected {{{{{stop[0]}}}}}")
        return nodes

    def _list(self) -> tuple[list[Any], tuple[str, int, list[_Token]] | None]:
        """Nodes up to the next ``else``/``end`` (returned with its tokens) or the end of the template."""
        nodes: list[Any] = []
        while self.pos < len(self.items):
            kind, text, line = self.items[self.pos]
            self.pos += 1
            if kind == "text":
                nodes.append(_Text(text))
                continue
            tokens = _lex_action(text, line)
            if not tokens:
                raise TemplateError(f"template: message:{line}: missing value for command")
            head = tokens[0]
            if head.kind == "identifier" and head.text in ("else", "end"):
                return nodes, (head.text, line, tokens[1:])
            if head.kind == "identifier" and head.text in ("if", "with", "range"):
                nodes.append(self._branch(head.text, tokens[1:], line))
            elif head.kind == "identifier" and head.text in ("break", "continue"):
                if self.loops == 0 or len(tokens) > 1:
                    raise TemplateError(
                        f"template: message:{line}: {{{{{head.text}}}}} outside {{{{range}}}}"
                    )
                nodes.append(_Loop(head.text))
            elif head.kind == "identifier" and head.text in _UNSUPPORTED_KEYWORDS:
                raise TemplateError(
                    f"template: message:{line}: {{{{{head.text}}}}} is not supported by queue-processor"
                )
            else:
                nodes.append(_Action(self._pipeline(tokens, line, "command")))
        return nodes, None

    def _branch(self, keyword: str, tokens: list[_Token], line: int) -> _Branch:
        self.variables.append(set())
        pipeline = self._pipeline(tokens, line, keyword)
        if keyword == "range":
            self.loops += 1
        body, stop = self._list()
        if keyword == "range":
            self.loops -= 1
        if stop is None:
            raise TemplateError(f"template: message:{line}: unexpected EOF")
        otherwise: list[Any] = []
        if stop[0] == "else":
            rest = stop[2]
            if (
                rest
                and rest[0].kind == "identifier"
                and rest[0].text in ("if", "with")
                and keyword != "range"
            ):
                otherwise = [self._branch(rest[0].text, rest[1:], stop[1])]
                return _Branch(keyword, pipeline, body, otherwise)
            if rest:
                raise TemplateError(f"template: message:{stop[1]}: unexpected {rest[0].text} in else")
            otherwise, stop = self._list()
            if stop is None or stop[0] != "end":
                raise TemplateError(
                    f"template: message:{line}: expected end; found {stop[0] if stop else 'EOF'}"
                )
        if stop[2]:
            raise TemplateError(f"template: message:{stop[1]}: unexpected {stop[2][0].text} in end")
        self.variables.pop()
        return _Branch(keyword, pipeline, body, otherwise)

    def _pipeline(self, tokens: list[_Token], line: int, context: str) -> _Pipeline:
        declare: list[str] = []
        assign = False
        i = 0
        if tokens and tokens[0].kind == "variable":
            if len(tokens) > 1 and tokens[1].kind in ("declare", "assign"):
                declare, assign, i = [tokens[0].text], tokens[1].kind == "assign", 2
            elif context == "range" and len(tokens) > 3 and tokens[1].kind == "comma":
                if tokens[2].kind != "variable" or tokens[3].kind != "declare":
                    raise TemplateError(f"template: message:{line}: range can only initialize variables")
                declare, i = [tokens[0].text, tokens[2].text], 4
        if assign and not any(declare[0] in scope for scope in self.variables):
            raise TemplateError(f'template: message:{line}: undefined variable "{declare[0]}"')
        commands: list[_Command] = []
        current: list[_Operand] = []
        rest = tokens[i:]
        j = 0
        while j < len(rest):
            token = rest[j]
            if token.kind == "space":
                j += 1
                continue
            if token.kind == "pipe":
                if not current:
                    raise TemplateError(f"template: message:{line}: missing command")
                commands.append(_Command(current))
                current = []
                j += 1
                continue
            operand, j = self._operand(rest, j, line)
            current.append(operand)
        if not current:
            raise TemplateError(f"template: message:{line}: missing value for {context}")
        commands.append(_Command(current))
        for command in commands[1:]:
            if command.operands[0].kind in ("literal",) and command.operands[0].fields == []:
                raise TemplateError(f"template: message:{line}: non executable command in pipeline stage 2")
        if declare and not assign:
            self.variables[-1].update(declare)
        return _Pipeline(commands, declare, assign, line)

    def _operand(self, tokens: list[_Token], j: int, line: int) -> tuple[_Operand, int]:
        token = tokens[j]
        j += 1
        kind = token.kind
        if kind == "field":
            operand = _Operand("dot", fields=[token.text[1:]], line=line)
        elif kind == "dot":
            operand = _Operand("dot", line=line)
        elif kind == "variable":
            if not any(token.text in scope for scope in self.variables):
                raise TemplateError(f'template: message:{line}: undefined variable "{token.text}"')
            operand = _Operand("variable", token.text, line=line)
        elif kind == "string":
            operand = _Operand("literal", _unquote(token.text), line=line)
        elif kind == "raw":
            operand = _Operand("literal", token.text[1:-1], line=line)
        elif kind == "number":
            operand = _Operand("literal", int(token.text.replace("_", ""), 0), line=line)
        elif kind == "identifier" and token.text in ("true", "false"):
            operand = _Operand("literal", token.text == "true", line=line)
        elif kind == "identifier" and token.text == "nil":
            operand = _Operand("literal", None, line=line)
        elif kind == "identifier":
            if token.text not in FUNCTIONS:
                raise TemplateError(
                    f'template: message:{line}: function "{token.text}" not defined'
                    " (or not one of the sprig functions queue-processor implements)"
                )
            operand = _Operand("function", token.text, line=line)
        elif kind == "lparen":
            depth, k = 1, j
            while k < len(tokens) and depth:
                depth += {"lparen": 1, "rparen": -1}.get(tokens[k].kind, 0)
                k += 1
            if depth:
                raise TemplateError(f"template: message:{line}: unclosed left paren")
            inner = self._pipeline(tokens[j : k - 1], line, "parenthesized pipeline")
            operand = _Operand("pipeline", inner, line=line)
            j = k
        else:
            raise TemplateError(f"template: message:{line}: unexpected {token.text!r} in command")
        while j < len(tokens) and tokens[j].kind == "field":
            operand.fields.append(tokens[j].text[1:])
            j += 1
        if j < len(tokens) and tokens[j].kind == "space":
            j += 1
        if operand.fields and operand.kind in ("literal", "function"):
            raise TemplateError(f"template: message:{line}: unexpected . after term {token.text!r}")
        return operand, j


def _action_end(source: str, start: int, line: int) -> int:
    """Where the action that starts at ``start`` ends (the index of its ``}}``), quotes respected."""
    i = start
    while i < len(source):
        char = source[i]
        if source.startswith("}}", i):
            return i
        if char in "\"'`":
            close = i + 1
            while close < len(source) and source[close] != char:
                if char != "`" and source[close] == "\\":
                    close += 1
                if char != "`" and source[close] == "\n":
                    raise TemplateError(f"template: message:{line}: unterminated quoted string")
                close += 1
            i = close + 1
            continue
        i += 1
    raise TemplateError(f"template: message:{line}: unclosed action")


# -------------------------------------------------------------------------------------------- execution


class Template:
    """A parsed template. :meth:`execute` renders it over a :class:`Struct`."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.nodes = _Parser(source).parse()

    def execute(self, data: Any) -> str:
        """The template rendered with ``data`` as dot; raises :class:`TemplateError` as Go's ``Execute``
        fails (a missing field, a wrong argument type)."""
        out: list[str] = []
        _Run(out).walk(self.nodes, data, [{"$": data}])
        return "".join(out)


class _Run:
    def __init__(self, out: list[str]) -> None:
        self.out = out

    def walk(self, nodes: list[Any], dot: Any, scopes: list[dict[str, Any]]) -> None:
        for node in nodes:
            if isinstance(node, _Text):
                self.out.append(node.text)
            elif isinstance(node, _Action):
                value = self.pipeline(node.pipeline, dot, scopes)
                if not node.pipeline.declare:  # a nil interface{} result has no value, as Go prints it
                    self.out.append("<no value>" if value is None else printed(value))
            elif isinstance(node, _Branch):
                self.branch(node, dot, scopes)
            elif isinstance(node, _Loop):
                raise _Break() if node.keyword == "break" else _Continue()

    def branch(self, node: _Branch, dot: Any, scopes: list[dict[str, Any]]) -> None:
        inner = [*scopes, {}]
        if node.keyword == "range":
            self.range(node, dot, inner)
            return
        value = self.pipeline(node.pipeline, dot, inner)
        if truth(value):
            self.walk(node.body, value if node.keyword == "with" else dot, inner)
        else:
            self.walk(node.otherwise, dot, inner)

    def range(self, node: _Branch, dot: Any, scopes: list[dict[str, Any]]) -> None:
        pipeline = node.pipeline
        value = self.pipeline(_Pipeline(pipeline.commands, line=pipeline.line), dot, scopes)
        if value is MISSING or value is None:
            items: list[tuple[Any, Any]] = []
        elif isinstance(value, dict) and not isinstance(value, Struct):
            items = [(k, value[k]) for k in sorted(value)]
        elif isinstance(value, list):
            items = list(enumerate(value))
        elif isinstance(value, int) and not isinstance(value, bool):
            items = [(i, i) for i in range(value)]
        else:
            raise TemplateError(
                f"template: message:{pipeline.line}: range can't iterate over {printed(value)}"
            )
        if not items:
            self.walk(node.otherwise, dot, scopes)
            return
        for key, element in items:
            scope: dict[str, Any] = {}
            if len(pipeline.declare) == 1:
                scope[pipeline.declare[0]] = element
            elif len(pipeline.declare) == 2:
                scope[pipeline.declare[0]] = key
                scope[pipeline.declare[1]] = element
            try:
                self.walk(node.body, element, [*scopes[:-1], scope])
            except _Continue:
                continue
            except _Break:
                break

    def pipeline(self, pipeline: _Pipeline, dot: Any, scopes: list[dict[str, Any]]) -> Any:
        value: Any = _NO_FINAL
        for command in pipeline.commands:
            value = self.command(command, dot, scopes, value)
        if pipeline.declare:
            if pipeline.assign:
                for scope in reversed(scopes):
                    if pipeline.declare[0] in scope:
                        scope[pipeline.declare[0]] = value
                        break
            else:
                scopes[-1][pipeline.declare[0]] = value
        return value

    def command(self, command: _Command, dot: Any, scopes: list[dict[str, Any]], final: Any) -> Any:
        head, args = command.operands[0], command.operands[1:]
        if head.kind == "function":
            name = str(head.value)
            if name in ("and", "or"):
                return self.logic(name, args, dot, scopes, final)
            values = [self.operand(a, dot, scopes) for a in args]
            if final is not _NO_FINAL:
                values.append(final)
            values = [None if v is MISSING else v for v in values]  # no value passed as interface{}: nil
            try:
                return FUNCTIONS[name](*values)
            except TemplateError as exc:
                raise TemplateError(f"template: message:{head.line}: error calling {name}: {exc}") from exc
            except TypeError as exc:
                raise TemplateError(
                    f"template: message:{head.line}: wrong number of args for {name}"
                ) from exc
        if head.fields and (args or final is not _NO_FINAL):
            receiver = self.operand(_Operand(head.kind, head.value, head.fields[:-1], head.line), dot, scopes)
            values = [self.operand(a, dot, scopes) for a in args]
            if final is not _NO_FINAL:
                values.append(final)
            return self.method(receiver, head.fields[-1], values, head.line)
        if args or final is not _NO_FINAL:
            raise TemplateError(f"template: message:{head.line}: can't give argument to non-function")
        return self.operand(head, dot, scopes)

    def logic(
        self, name: str, args: list[_Operand], dot: Any, scopes: list[dict[str, Any]], final: Any
    ) -> Any:
        values: list[Callable[[], Any]] = [lambda a=a: self.operand(a, dot, scopes) for a in args]  # type: ignore[misc]
        if final is not _NO_FINAL:
            values.append(lambda: final)
        if not values:
            raise TemplateError(f"wrong number of args for {name}: want at least 1 got 0")
        value: Any = None
        for get in values:
            value = get()
            if truth(value) == (name == "or"):
                return value
        return value

    def operand(self, operand: _Operand, dot: Any, scopes: list[dict[str, Any]]) -> Any:
        if operand.kind == "literal":
            value = operand.value
        elif operand.kind == "function":  # a function as an argument is called without arguments
            try:
                value = FUNCTIONS[str(operand.value)]()
            except TypeError as exc:
                raise TemplateError(
                    f"template: message:{operand.line}: wrong number of args for {operand.value}"
                ) from exc
        elif operand.kind == "dot":
            value = dot
        elif operand.kind == "variable":
            value = next(scope[operand.value] for scope in reversed(scopes) if operand.value in scope)
        else:
            value = self.pipeline(operand.value, dot, scopes)
        for name in operand.fields:
            value = self.field(value, name, operand.line)
        return value

    def field(self, value: Any, name: str, line: int) -> Any:
        if value is None or value is MISSING:  # a field of no value has no value, as Go evaluates it
            return MISSING
        if isinstance(value, Struct):
            if name not in value:
                raise TemplateError(
                    f"template: message:{line}: can't evaluate field {name} in type {value.type_name}"
                )
            return value[name]
        if isinstance(value, dict):
            return value.get(name, MISSING)
        if isinstance(value, GoTime) and name in TIME_METHODS and name != "Format":
            return TIME_METHODS[name](value)
        raise TemplateError(
            f"template: message:{line}: can't evaluate field {name} in type {_type_name(value)}"
        )

    def method(self, receiver: Any, name: str, args: list[Any], line: int) -> Any:
        if receiver is None or receiver is MISSING:
            return MISSING
        if isinstance(receiver, GoTime) and name in TIME_METHODS:
            try:
                return TIME_METHODS[name](receiver, *args)
            except TypeError as exc:
                raise TemplateError(f"template: message:{line}: wrong number of args for {name}") from exc
        raise TemplateError(
            f"template: message:{line}: {name} has arguments but cannot be invoked as function"
        )


_NO_FINAL: Any = object()


def parse(source: str) -> Template:
    """Parse ``source`` (see the module docstring for what is supported); raises :class:`TemplateError`."""
    return Template(source)

"""What PostgreSQL can store of what a handler hands back: results checked before they are written, and
diagnostic text (errors, tracebacks, progress messages, log lines) made storable and bounded.

PostgreSQL refuses a NUL character in text and in jsonb, a lone UTF-16 surrogate, and NaN or Infinity in
jsonb. A result is data the next reader relies on, so one it cannot hold fails its attempt (NotStorable);
an error text only describes a failure, so it is repaired (escaped and cut) rather than refused.
"""

from __future__ import annotations

import json
import re
from typing import Any

# An escaped NUL in JSON text: "\u0000" after an even number of backslashes (an odd number escapes the
# backslash itself, as in the string "\\u0000").
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
_MARKER = "… [cut: {} more bytes]"


class NotStorable(ValueError):
    """A handler's result that PostgreSQL cannot store (not JSON, NUL, lone surrogate, or over the bound)."""


def result_json(value: Any, max_bytes: int | None = None) -> str:
    """The result as JSON text that jsonb accepts, at most `max_bytes` bytes of UTF-8; NotStorable otherwise."""
    try:
        text = json.dumps(value, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    except RecursionError:
        raise NotStorable("the result is nested too deeply to be written as JSON") from None
    except (TypeError, ValueError) as exc:
        raise NotStorable(f"the result is not JSON ({safe_str(exc)}); return JSON values (dict, list, str, "
                          "finite number, bool) or None") from None
    if _JSON_NUL.search(text):
        raise NotStorable("the result holds a NUL character (\\u0000), which PostgreSQL cannot store") from None
    if max_bytes is not None:
        check_result_size(text, max_bytes)
    else:
        _utf8_size(text)
    return text


def check_result_size(text: str, max_bytes: int) -> None:
    """NotStorable when the result's JSON text is over `max_bytes` bytes of UTF-8 (or is not UTF-8)."""
    size = _utf8_size(text)
    if size > max_bytes:
        raise NotStorable(f"the result is {size} bytes of JSON, over the bound of {max_bytes} bytes "
                          "(OUTBOXQ_MAX_RESULT_BYTES); store large data elsewhere and return a reference")


def _utf8_size(text: str) -> int:
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise NotStorable("the result holds a lone UTF-16 surrogate, which PostgreSQL cannot store") from None


def diagnostic_text(text: str | None, max_bytes: int) -> str | None:
    """The text with what PostgreSQL cannot hold escaped (NUL as \\x00, lone surrogates as \\udxxx), cut to at
    most `max_bytes` bytes of UTF-8 with a marker saying how much was cut."""
    if text is None:
        return None
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    data = text.encode("utf-8", "backslashreplace")  # (lone surrogates become their \udxxx escape)
    if len(data) <= max_bytes:
        return data.decode("utf-8")
    room = max(0, max_bytes - len(_MARKER.format(len(data)).encode("utf-8")))  # (the count's widest)
    kept = data[:room].decode("utf-8", "ignore")  # (never half a character)
    return kept + _MARKER.format(len(data) - len(kept.encode("utf-8")))


def safe_str(value: object) -> str:
    """str(value), or a description of the value when its __str__ raises (a handler's exception may)."""
    try:
        return str(value)
    except Exception as exc:  # noqa: BLE001 - any failure of a foreign __str__
        return f"<{type(value).__name__} whose str() raised {type(exc).__name__}>"


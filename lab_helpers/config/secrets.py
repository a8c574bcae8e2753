"""The lab's one redaction: no token in anything it stores or shows, while what it *uses* (a recipe's paths, the
environment) is never changed. A Hugging Face token sits in a student's environment, litgpt prints its arguments
(``access_token`` included) and an error can quote anything, so text is masked by the secret-named variables' values
(URL- or base64-encoded and split over two lines too), by token shapes and by secret-looking keys' values.
``python -m lab_helpers.config.secrets`` masks its standard input: the GPU scripts pipe their logs through it.
"""

from __future__ import annotations

import base64
import binascii
import functools
import os
import re
import sys
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from typing import Any

MASK = "***"
_MIN_SECRET_LEN = 6  # shorter values ("1", "true") would mask innocent text
_MIN_SPLIT = 4  # the shortest piece of a secret at a line's end that is masked as a secret split over two lines

# a word of a name (split at anything not a letter or digit) that makes it a secret's name
_SECRET_WORDS = frozenset(
    {"TOKEN", "KEY", "APIKEY", "SECRET", "PASSWORD", "PASSWD", "PAT", "AUTH", "CREDENTIAL", "CREDENTIALS"}
)
_SECRET_ENDINGS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "APIKEY", "CREDENTIALS")  # ACCESSTOKEN, CLIENTSECRET
_NOT_A_SECRET_LAST = frozenset({"SOCK", "DIR", "PATH", "FILE", "HOME"})  # HF_TOKEN_PATH names a file, not a token
_NOT_A_SECRET_VALUE = frozenset({"none", "null", "true", "false", "", MASK})

# a token's shape, wherever it appears
_SHAPES = (
    r"hf_[A-Za-z0-9]{20,}",  # Hugging Face
    r"gh[pousr]_[A-Za-z0-9]{30,}",  # GitHub classic
    r"github_pat_[A-Za-z0-9_]{40,}",  # GitHub fine-grained
    r"sk-(?=[A-Za-z0-9_-]*[0-9])[A-Za-z0-9_-]{20,}",  # OpenAI, Anthropic (sk-ant-...), Stripe
    r"(?:AKIA|ASIA)[0-9A-Z]{16}",  # AWS access key id
    r"xox[abposr]-[A-Za-z0-9-]{10,}",  # Slack
)
_SHAPE = re.compile(r"(?<![A-Za-z0-9_-])(?:" + "|".join(_SHAPES) + r")(?![A-Za-z0-9])")
# a shape's beginning at the end of a line: the rest may be on the next one
_SHAPE_AT_END = re.compile(
    r"(?<![A-Za-z0-9_-])(?P<prefix>hf_|gh[pousr]_|github_pat_|sk-|AKIA|ASIA|xox[abposr]-)(?P<body>[A-Za-z0-9_-]*)$"
)
_SHAPE_LENGTHS = {"hf_": 34, "github_pat_": 82, "AKIA": 16, "ASIA": 16} | {f"gh{c}_": 36 for c in "pousr"}
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^\s/:@'\"]+:)(?P<secret>[^\s/@'\"]+)(?=@)")
_AUTH_HEADER = re.compile(
    r"(?i)(?P<head>(?<![/\\])\b(?:proxy-)?authorization['\"]?\s*[:=]\s*['\"]?(?:(?:basic|bearer|token|digest)\s+)?)"
    r"(?P<secret>[^\s'\",;]+)"
)
_BEARER = re.compile(r"(?P<head>\b(?:[Bb]earer|[Bb]asic)\s+)(?P<secret>[A-Za-z0-9+/=._~-]{12,})")
_BASE64_RUN = re.compile(r"(?<![A-Za-z0-9+/_-])[A-Za-z0-9+/_-]{16,}={0,2}(?![A-Za-z0-9+/_=-])")
# key=value, key: value, 'key': 'value', "key": "value", key = 'value': the value of a secret-looking key; a
# path's last part is no key ("../../etc/passwd: no such reference" is a message about a file, not a password)
_KEY_VALUE = re.compile(
    r"(?P<key>(?<![A-Za-z0-9_./\\-])[A-Za-z_][A-Za-z0-9_.-]*)(?P<sep>['\"]?\s*[:=]\s*(?P<quote>['\"]?))"
    r"(?P<value>[^\s'\",;{}()\[\]]+)"
)
_MAYBE_SECRET_WORD = re.compile(r"(?i)token|key|secret|passw|pat|auth|credential")
_PERCENT = re.compile(r"%[0-9A-F]{2}")


def looks_secret(name: str) -> bool:
    """Yes for ``HF_TOKEN``, ``access_token``, ``clientSecret``; no for ``PATH``, ``max_tokens``, ``HF_TOKEN_PATH``."""
    words = [w for w in re.split(r"[^A-Za-z0-9]+", str(name).upper()) if w]
    if not words or words[-1] in _NOT_A_SECRET_LAST:
        return False
    return any(w in _SECRET_WORDS or w.endswith(_SECRET_ENDINGS) for w in words)


def secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    environ = os.environ if environ is None else environ
    values = {
        v
        for k, v in environ.items()
        if looks_secret(k) and len(v) >= _MIN_SECRET_LEN and v.lower() not in _NOT_A_SECRET_VALUE
    }
    return sorted(values, key=len, reverse=True)  # longest first, so a secret containing another is masked whole


@functools.lru_cache(maxsize=64)
def _forms(secrets: tuple[str, ...]) -> tuple[str, ...]:
    """Each secret as it may be written: itself, URL-encoded, base64 (standard, URL-safe, unpadded)."""
    forms: set[str] = set()
    for value in secrets:
        forms.add(value)
        for quoted in (
            urllib.parse.quote(value, safe=""),
            urllib.parse.quote(value),
            urllib.parse.quote_plus(value),
        ):
            forms.add(quoted)
            forms.add(_PERCENT.sub(lambda m: m.group(0).lower(), quoted))
        raw = value.encode()
        for encoded in (base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode()):
            forms.add(encoded)
            forms.add(encoded.rstrip("="))
    return tuple(sorted((f for f in forms if len(f) >= _MIN_SECRET_LEN), key=len, reverse=True))


def _mask_group(match: re.Match, group: str = "secret") -> str:
    start, end = match.span(group)
    whole = match.group(0)
    base = match.start(0)
    return whole[: start - base] + MASK + whole[end - base :]


def _decodes_to_a_secret(run: str, secrets: tuple[str, ...]) -> bool:
    """Whether a base64-looking run decodes to text holding a secret (``Basic dXNlcjpnaHBf...`` of ``user:token``)."""
    body = run.rstrip("=")
    for decode in (base64.b64decode, base64.urlsafe_b64decode):
        try:
            text = decode(body + "=" * (-len(body) % 4)).decode("utf-8")
        except (binascii.Error, ValueError):
            continue
        if _SHAPE.search(text) or any(value in text for value in secrets):
            return True
    return False


def _key_value(match: re.Match) -> str:
    key, value = match.group("key"), match.group("value")
    if not looks_secret(key.rsplit(".", 1)[-1]) or value.lower() in _NOT_A_SECRET_VALUE or value.startswith(MASK):
        return match.group(0)
    if re.fullmatch(r"[-+]?[0-9.]+", value):  # pad_token_id: 0, max_tokens ... numbers are never the secret
        return match.group(0)
    return match.group("key") + match.group("sep") + MASK


def _redact_one_line(line: str, secrets: tuple[str, ...]) -> str:
    for form in _forms(secrets):
        if form in line:
            line = line.replace(form, MASK)
    line = _SHAPE.sub(MASK, line)
    if "://" in line:
        line = _URL_PASSWORD.sub(_mask_group, line)
    if _MAYBE_SECRET_WORD.search(line):
        line = _AUTH_HEADER.sub(lambda m: m.group(0) if m.group("secret").startswith(MASK) else _mask_group(m), line)
        line = _KEY_VALUE.sub(_key_value, line)
    if "earer" in line or "asic" in line:
        line = _BEARER.sub(
            lambda m: _mask_group(m) if re.search(r"[0-9+/=]", m.group("secret")) else m.group(0),
            line,
        )
    if len(line) >= 16:
        line = _BASE64_RUN.sub(lambda m: MASK if _decodes_to_a_secret(m.group(0), secrets) else m.group(0), line)
    return line


class LineRedactor:
    """Masks a stream of lines, including a secret split over two: a line ending with a secret's beginning has that
    end masked, and the next line's beginning too if it goes on with it."""

    def __init__(self, environ: Mapping[str, str] | None = None, *, secrets: Iterable[str] | None = None) -> None:
        self.secrets = tuple(secret_values(environ) if secrets is None else secrets)
        self._rests: tuple[str, ...] = ()  # what the previous line's end expects next: the rest of a secret
        self._shape_goes_on = False  # ...or the rest of a token's shape

    def __call__(self, line: str) -> str:
        end = "\r" if line.endswith("\r") else ""
        line = line[: len(line) - len(end)]
        head = ""
        if self._rests or self._shape_goes_on:
            head, line = self._continued(line)
        main, tail = self._split_end(line)
        return head + _redact_one_line(main, self.secrets) + (MASK if tail else "") + end

    def _continued(self, line: str) -> tuple[str, str]:
        rests, shape_goes_on = self._rests, self._shape_goes_on
        self._rests, self._shape_goes_on = (), False
        body = line.lstrip(" \t")
        indent = line[: len(line) - len(body)]
        for rest in rests:
            if body.startswith(rest):
                return indent + MASK, body[len(rest) :]
        if shape_goes_on and not indent:  # a token broken by a line wrap goes on at the line's start
            match = re.match(r"[A-Za-z0-9_-]+", body)
            if match:
                return MASK, body[match.end() :]
        return "", line

    def _split_end(self, line: str) -> tuple[str, str]:
        """(the line, the beginning of a secret or a token at its end), remembering what would follow it."""
        if not line:
            return line, ""
        cut = len(line)
        rests: list[str] = []
        last = line[-1]
        for form in _forms(self.secrets):
            k = form.rfind(last, 0, len(form) - 1) + 1
            while k >= _MIN_SPLIT:  # the longest beginning of ``form`` that ends the line
                if line.endswith(form[:k]):
                    rests.append(form[k:])
                    cut = min(cut, len(line) - k)
                    break
                k = form.rfind(last, 0, k - 1) + 1
        match = _SHAPE_AT_END.search(line)
        if match:
            full = _SHAPE_LENGTHS.get(match.group("prefix"))
            body = len(match.group("body"))
            if full is None or body < full:  # a token of varying length, or one shorter than its shape's
                self._shape_goes_on = True
                cut = min(cut, match.start())
        self._rests = tuple(rests)
        return line[:cut], line[cut:]


def redact(text: str, secrets: Iterable[str] | None = None) -> str:
    redactor = LineRedactor(secrets=secret_values() if secrets is None else secrets)
    if "\n" not in text:
        return redactor(text)
    return "\n".join(redactor(line) for line in text.split("\n"))


def redact_mapping(value: Any, secrets: Iterable[str] | None = None) -> Any:
    secrets = tuple(secret_values() if secrets is None else secrets)
    if isinstance(value, Mapping):
        return {k: (MASK if _masks_whole(k, v) else redact_mapping(v, secrets)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_mapping(v, secrets) for v in value]
    if isinstance(value, str):
        return redact(value, secrets)
    return value


def _masks_whole(key: Any, value: Any) -> bool:
    """A number or a flag is never a secret (``lora_key: true``, ``pad_token_id: 0``)."""
    return isinstance(value, str) and value.lower() not in _NOT_A_SECRET_VALUE and looks_secret(str(key))


def mask_secret_keys(value: Any) -> Any:
    """For what is *used* (a recipe a training process reads): a path that merely looks like a token must stay."""
    if isinstance(value, Mapping):
        return {k: (MASK if _masks_whole(k, v) else mask_secret_keys(v)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [mask_secret_keys(v) for v in value]
    return value


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def for_terminal(text: str, secrets: Iterable[str] | None = None) -> str:
    """Secrets masked, and control characters (an escape sequence, a bidi override) shown escaped, not acted on."""
    return _CONTROL.sub(lambda m: m.group(0).encode("unicode_escape").decode("ascii"), redact(text, secrets))


def _filter(lines: Iterable[str], write: Callable[[str], Any]) -> None:
    redactor = LineRedactor()
    for line in lines:
        newline = "\n" if line.endswith("\n") else ""
        write(redactor(line[: len(line) - len(newline)]) + newline)


if __name__ == "__main__":  # the GPU scripts' filter: python -m lab_helpers.config.secrets < log > masked-log
    sys.stdin.reconfigure(errors="replace")
    _filter(sys.stdin, sys.stdout.write)

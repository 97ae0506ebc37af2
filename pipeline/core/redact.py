"""One redaction rule for everything that leaves the process: errors, logs, echoes, files.

Secrets live only in environment variables. A variable counts as a secret when the config
names it (``backend.openai.api_key_env``, ``annotation.token_env``: ``load_config`` registers
them), when it is a Hugging Face token, or when its name ends in KEY, TOKEN, SECRET or
PASSWORD. Values shorter than ``MIN_SECRET_LEN`` are ignored: masking "1" or "true" would
garble innocent text and protect nothing.

``redact(text)`` replaces every such value (also in its JSON-escaped and URL-quoted
forms, as a server may echo it inside a JSON body or a query string), strips the
``user:password@`` part of any URL, masks the value of every query parameter named like a
credential (``?api-key=``, ``&token=``, ``&sig=``...), and masks bearer tokens and
OpenAI / Hugging Face key shapes even when no variable holds them.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterable, Mapping
from urllib.parse import parse_qsl, quote, urlsplit, urlunsplit

MIN_SECRET_LEN = 8
SECRET_NAME_RE = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD)$", re.IGNORECASE)
ALWAYS_SECRET = frozenset({"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"})
# URL passwords are masked from this length: shorter ones would mask common words.
_MIN_URL_PASSWORD_LEN = 4

# scheme://user[:password]@host  ->  scheme://***@host
_URL_USERINFO_RE = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^\s/?#@\"'<>]+@")
# Query parameters whose value is a credential: api-key, key, token, access_token, sig,
# signature, password, client_secret, x-amz-signature, subscription-key... A name that
# merely ends in "key" (monkey=) is masked too: masking an innocent value costs nothing.
_QUERY_SECRET_NAME = (
    r"[A-Za-z0-9_.\-]*?(?:key|token|secret|password|passwd|pwd|sig|signature|credential|auth)"
)
_QUERY_SECRET_RE = re.compile(rf"(?P<pre>[?&;]{_QUERY_SECRET_NAME}=)[^&#\s\"'<>]+", re.IGNORECASE)
_QUERY_SECRET_NAME_RE = re.compile(rf"{_QUERY_SECRET_NAME}", re.IGNORECASE)
# Credential shapes worth masking even when no configured variable holds them: an
# Authorization header value (it has a digit: "Token validation" is prose), an
# OpenAI-style key, a Hugging Face token.
_SHAPES_RE = re.compile(
    r"(?P<auth>\b(?:Bearer|Token)\s+)(?=[A-Za-z._~+/=-]*[0-9])[A-Za-z0-9._~+/=-]{8,}"
    r"|\bsk-[A-Za-z0-9_-]{16,}"
    r"|\bhf_[A-Za-z0-9]{16,}"
)

_lock = threading.Lock()
_names: set[str] = set()
_values: set[str] = set()


def register_names(names: Iterable[str | None]) -> None:
    """Treat these environment variables as secrets from now on (config-named ones)."""
    with _lock:
        _names.update(n for n in names if n)


def register_value(value: str | None) -> None:
    """Mask this literal value from now on (a password found in a configured URL)."""
    if value and len(value) >= _MIN_URL_PASSWORD_LEN:
        with _lock:
            _values.add(value)


def secret_names(
    extra: Iterable[str | None] = (), environ: Mapping[str, str] | None = None
) -> set[str]:
    """Names of the environment variables that hold secrets (set or not)."""
    env = os.environ if environ is None else environ
    with _lock:
        names = set(_names)
    names |= ALWAYS_SECRET | {n for n in extra if n}
    names |= {k for k in env if SECRET_NAME_RE.search(k)}
    return names


def secret_values(
    extra: Iterable[str | None] = (), environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Environment variable name -> value for every secret long enough to mask."""
    env = os.environ if environ is None else environ
    out = {}
    for name in sorted(secret_names(extra, env)):
        value = env.get(name) or ""
        if len(value) >= MIN_SECRET_LEN:
            out[name] = value
    return out


def _forms(value: str) -> set[str]:
    """The spellings a value may take inside a JSON body or a URL."""
    escaped = json.dumps(value)[1:-1]
    # some servers also escape a slash in JSON (a backslash before it)
    forms = {value, escaped, escaped.replace("/", "\\/"), quote(value, safe="")}
    return {f for f in forms if f}


def redact(text: str) -> str:
    """``text`` with every secret value, URL password and credential shape masked."""
    if not text:
        return text
    masks: list[tuple[str, str]] = []
    for name, value in secret_values().items():
        masks.extend((form, f"<${name}>") for form in _forms(value))
    with _lock:
        literal = list(_values)
    for value in literal:
        masks.extend((form, "***") for form in _forms(value))
    # longest first, so a value that contains another is masked whole
    for form, mask in sorted(masks, key=lambda m: len(m[0]), reverse=True):
        if form in text:
            text = text.replace(form, mask)
    text = _URL_USERINFO_RE.sub(r"\g<scheme>***@", text)
    text = _QUERY_SECRET_RE.sub(r"\g<pre>***", text)
    return _SHAPES_RE.sub(lambda m: (m.group("auth") or "") + "***", text)


def url_secrets(url: str) -> list[str]:
    """The credentials written into ``url``: its password and every query value whose
    parameter is named like a credential (``?api-key=...``)."""
    try:
        parts = urlsplit(url)
        found = [parts.password] if parts.password else []
    except ValueError:
        return []
    found += [
        v
        for k, v in parse_qsl(parts.query, keep_blank_values=False)
        if _QUERY_SECRET_NAME_RE.fullmatch(k)
    ]
    return found


def public_url(url: str) -> str:
    """``url`` as it may be shown or written: without ``user:password@`` and with the
    value of each credential query parameter replaced by ``***``."""
    return _QUERY_SECRET_RE.sub(r"\g<pre>***", strip_userinfo(url))


def strip_userinfo(url: str) -> str:
    """``url`` without its ``user:password@`` part; anything that is not a URL unchanged."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return _URL_USERINFO_RE.sub(r"\g<scheme>", url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))

"""Secrets stay out of everything smlaunch prints, logs or writes for sharing: one policy.

**By name.** A key names a secret when one of its words is a secret word. Words come from
snake_case, kebab-case, dotted and camelCase names alike (`hf_token`, `x-api-key`,
`clientSecret`, `HFToken`). Two kinds of secret words:

- TOKEN, SECRET, PASSWORD, PASSWD, CREDENTIAL and KEY match a whole word, its plural, or the end
  of a word (`apikey`, `hftoken`, `dbpassword`, `GOOGLE_CREDENTIALS`), never its start or middle:
  `tokenizer`, `TOKENIZERS_PARALLELISM` and `keyboard` are not secrets (a rare `monkey` is: too
  much masking is the safe side).
- PASS, PWD, PAT, AUTH and PRIVATE match only a whole word: as parts of words they are ordinary
  words (`bypass`, `passthrough`, `compat`, `path`, `patience`, `author`, `oauth`).

Not secrets although a word matches: a tokenizer's special tokens (`pad_token`, `eos_token`,
`bos_token`, `unk_token`, `sep_token`, `cls_token`, `mask_token`, `special_tokens`: vocabulary
entries, not credentials) and the shell's `PWD` variable (the working directory; `pwd` and
`DB_PWD` are secrets). Numbers and booleans stay visible under any name (`num_key_value_heads`
and `max_tokens` are counts); a purely numeric secret would therefore show, a trade-off made for
readable requests and logs. The value of a secret-named key is masked whole; a dict under such a
key is masked by its own keys, a list item by item.

Whatever the key, a URL with a password (`scheme://user:password@host`) shows as
`scheme://user:****@host`, a URL whose user-info is the credential (`scheme://key@host`, a Sentry
DSN) as `scheme://****@host`, and an Azure connection string's `AccountKey=`, `SharedAccessKey=`
and `SharedAccessSignature=` values as `****`.

**By value.** `Masker` replaces every occurrence of the secrets it was given (longest first)
in any text: the values of secret-named keys (JSON-decoded too, as hyperparameters travel
JSON-encoded), each line of a multi-line one, and the passwords of URLs. Values shorter than
MIN_SECRET_LENGTH characters are not replaced by value (masking "ab" everywhere would garble
every line); by name they are still masked. `StreamMasker` does the same to output that arrives
in pieces, holding back only a tail that could be the start of a secret.

**Credential files.** `credential_pattern` says which files a code archive leaves out
(launcher.backends.sourcedir): CREDENTIAL_PATTERNS, matched case-insensitively with fnmatch on a
file's name, on the end of its path for a pattern with '/', and on a directory's name or the end of
its path (the whole directory) for a pattern ending in '/'.

Inside the training container the bootstrap installs the masker of its job (the job's
hyperparameters and the process environment) with `install`; its log lines, failure file, the
command's stdout and stderr and the ranks' output (container.toolkit.rank_logs) go through `installed()`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from fnmatch import fnmatchcase
from typing import Any
from urllib.parse import unquote

MASK = "****"
MIN_SECRET_LENGTH = 4
SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "KEY")  # also as a word's end
WHOLE_SECRET_WORDS = ("PASS", "PWD", "PAT", "AUTH", "PRIVATE")  # only as a whole word
SPECIAL_TOKENS = ("PAD", "EOS", "BOS", "UNK", "SEP", "CLS", "MASK", "SPECIAL")  # before TOKEN(S)
NOT_SECRET_NAMES = ("PWD",)  # exact names
# camelCase humps, ACRONYMS, lowercase runs and digit runs; anything else separates words.
_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
# scheme://user:password@host: the password is group 2 (up to the last '@' of the authority).
# The lookbehind starts a scheme only where a run of scheme characters starts: linear time on
# long runs of letters (a base64 blob), which would otherwise be rescanned from every position.
_SCHEME = r"(?<![A-Za-z0-9+.\-])[A-Za-z][A-Za-z0-9+.\-]*://"
_URL_PASSWORD = "(" + _SCHEME + r"[^\s:/?#@]*:)([^\s/?#]+)(@)"
# scheme://key@host: user-info without a password is the credential itself (a Sentry DSN's key).
_URL_USER = "(" + _SCHEME + r")([^\s:/?#@]+)(@)"
# Azure connection strings: `AccountKey=...;`, `SharedAccessKey=...;`, `SharedAccessSignature=sv=..&sig=..;`.
_KEY_FRAGMENT = r"((?<![A-Za-z0-9])(?i:AccountKey|SharedAccessKey|SharedAccessSignature)=)([^;\s\"']+)()"
# Each: (what precedes the secret)(the secret)(what follows it).
_SECRET_SHAPES = "|".join(f"(?:{shape})" for shape in (_URL_PASSWORD, _URL_USER, _KEY_FRAGMENT))
_URL_TEXT = re.compile(_SECRET_SHAPES)
_URL_BYTES = re.compile(_SECRET_SHAPES.encode())
# The authority of a URL still being written (no '@' yet), or a key fragment not yet ended by ';':
# its secret may go on in the next piece.
_OPEN_URL = re.compile(_SCHEME.encode() + rb"[^\s/?#@]*\Z|" + _KEY_FRAGMENT[:-2].encode() + rb"[^;\s\"']*\Z")
_OPEN_URL_LIMIT = 4096  # longer than any authority: output keeps flowing


def is_secret_name(name: str) -> bool:
    if name in NOT_SECRET_NAMES:
        return False
    words = [w.upper() for w in _WORDS.findall(str(name))]
    return any(_secret_word(word, words[i - 1] if i else "") for i, word in enumerate(words))


def carries_secret(key: str, value: Any) -> bool:
    """Whether `key: value` holds a secret: a secret-named key (a number too), or a value the masker
    would hide part of whatever its key (a URL password, a DSN's key, an Azure key, a secret-named key
    inside it). What a manifest may not carry in clear (launcher.kubernetes.manifest)."""
    return is_secret_name(key) or bool(secret_values({key: value}))


def _secret_word(word: str, before: str) -> bool:
    if word in WHOLE_SECRET_WORDS:
        return True
    stem = word.removesuffix("S")  # plurals: api_keys, CREDENTIALS
    for secret in SECRET_WORDS:
        if stem.endswith(secret):
            return not (secret == "TOKEN" and stem == secret and before in SPECIAL_TOKENS)
    return False


def _looks_numeric(value: Any) -> bool:
    # Counts such as num_key_value_heads stay visible; secrets are strings.
    if isinstance(value, (bool, int, float)):
        return True
    if isinstance(value, str):
        try:
            return isinstance(json.loads(value), (bool, int, float))
        except ValueError:
            return False
    return False


def _is_tag(obj: Mapping) -> bool:
    return set(obj) == {"Key", "Value"} and isinstance(obj["Key"], str)  # an AWS tag


# --- which values are secret ------------------------------------------------------------------

def secret_values(*sources: Any) -> set[str]:
    """The secrets in `sources` (dicts, lists, strings): values of secret-named keys, passwords
    of URLs anywhere. What `mask_secrets` hides by name is exactly what this collects."""
    found: set[str] = set()
    for source in sources:
        _collect(source, False, found)
    return found


def _collect(obj: Any, secret: bool, found: set[str]) -> None:
    if isinstance(obj, Mapping):
        if _is_tag(obj):
            _collect(obj["Value"], is_secret_name(obj["Key"]), found)
            return
        for key, value in obj.items():
            _collect(value, is_secret_name(str(key)), found)
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            _collect(item, secret, found)
    elif isinstance(obj, str):
        for match in _URL_TEXT.finditer(obj):
            hidden = next(group for group in match.groups()[1::3] if group is not None)
            found.update({hidden, unquote(hidden)})
        if secret and not _looks_numeric(obj):
            found.add(obj)
            decoded = _json_string(obj)
            if decoded is not None:
                found.add(decoded)


def _json_string(value: str) -> str | None:
    """The string a JSON-encoded string holds ('"hf_x"' -> 'hf_x'), as hyperparameters travel."""
    try:
        decoded = json.loads(value)
    except ValueError:
        return None
    return decoded if isinstance(decoded, str) else None


def _variants(value: str) -> set[str]:
    """The forms a secret takes in output: itself, each of its lines, escaped inside JSON."""
    # A multi-line secret (a PEM key) is masked line by line: output is masked a line at a time.
    forms = {json.dumps(value)[1:-1], *value.splitlines()}
    return {form for form in forms if len(form) >= MIN_SECRET_LENGTH}


# --- masking by value ---------------------------------------------------------------------------

class Masker:
    """Replaces the given secrets (longest first) and URL passwords in text or bytes."""

    def __init__(self, values: Iterable[str] = ()):
        forms = {form for value in values for form in _variants(value)}
        self.values = tuple(sorted(forms, key=lambda v: (-len(v), v)))
        encoded = [v.encode() for v in self.values]
        self._text = re.compile("|".join(map(re.escape, self.values))) if self.values else None
        self._bytes = re.compile(b"|".join(map(re.escape, encoded))) if encoded else None
        # Proper prefixes: the tails of a piece of output that may continue as a secret.
        self._prefixes = {v[:i] for v in encoded for i in range(1, len(v))}
        self._longest = max(map(len, encoded), default=0)

    @classmethod
    def of(cls, *sources: Any) -> Masker:
        """A masker for the secrets in `sources` (see `secret_values`)."""
        return cls(secret_values(*sources))

    def __call__(self, text: str) -> str:
        if self._text is not None:
            text = self._text.sub(MASK, text)
        return _URL_TEXT.sub(_masked_shape, text)

    def mask_bytes(self, data: bytes) -> bytes:
        if self._bytes is not None:
            data = self._bytes.sub(MASK.encode(), data)
        return _URL_BYTES.sub(_masked_shape, data)

    def unsafe_tail(self, data: bytes) -> int:
        """How many bytes at the end of masked `data` may be the start of a secret or of a URL
        password still to come: they must wait for the next piece of output."""
        for size in range(min(len(data), self._longest - 1), 0, -1):
            if data[-size:] in self._prefixes:
                break
        else:
            size = 0
        url = _OPEN_URL.search(data[-_OPEN_URL_LIMIT:])
        return max(size, len(url.group()) if url else 0)


def _masked_shape(match: re.Match) -> Any:
    """A match of _SECRET_SHAPES with its secret group masked (three groups a shape)."""
    groups = match.groups()
    i = next(i for i in range(0, len(groups), 3) if groups[i + 1] is not None)
    mask = MASK if isinstance(groups[i + 1], str) else MASK.encode()
    return groups[i] + mask + groups[i + 2]


class StreamMasker:
    """Masks output that arrives in pieces (pipe reads, file tails): a secret cut in two by a
    piece boundary is still masked, and nothing else is held back."""

    def __init__(self, masker: Masker):
        self.masker = masker
        self._pending = b""

    def feed(self, data: bytes, final: bool = False) -> bytes:
        """What can be written now of the output so far; `final`: everything that is left."""
        masked = self.masker.mask_bytes(self._pending + data)
        keep = 0 if final else self.masker.unsafe_tail(masked)
        self._pending = masked[len(masked) - keep:]
        return masked[:len(masked) - keep]


def mask_command(args: Sequence[str], masker: Masker) -> list[str]:
    """A command line for printing: the value after a secret-named `--option` (or in
    `--option=value`) hidden whatever its length, every argument masked by value."""
    shown: list[str] = []
    hide_next = False
    for arg in args:
        if hide_next and not _looks_numeric(arg):
            arg = MASK
        hide_next = False
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            if is_secret_name(name):
                if eq and not _looks_numeric(value):
                    arg = f"--{name}={MASK}"
                hide_next = not eq
        shown.append(masker(arg))
    return shown


# --- masking a structure (a request, a described job, a finding) -----------------------------------

def mask_secrets(obj: Any) -> Any:
    """A copy of obj for printing: secret-named values replaced by '****', and every secret
    they hold (and every URL password) masked wherever else it appears in obj."""
    return _masked(obj, Masker.of(obj))


def mask_value(path: str, value: Any) -> Any:
    """A finding's value for printing: masked as the value of the last part of its dotted path."""
    key = re.split(r"[.\[]", path)[-1]
    return mask_secrets({key: value})[key]


def _masked(obj: Any, masker: Masker) -> Any:
    if isinstance(obj, Mapping):
        if _is_tag(obj):
            value = _hidden(obj["Value"], masker) if is_secret_name(obj["Key"]) else _masked(obj["Value"], masker)
            return {"Key": obj["Key"], "Value": value}
        return {k: _hidden(v, masker) if is_secret_name(str(k)) else _masked(v, masker) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_masked(v, masker) for v in obj]
    if isinstance(obj, str):
        return masker(obj)
    return obj


def _hidden(value: Any, masker: Masker) -> Any:
    """The value of a secret-named key."""
    if isinstance(value, Mapping):
        return _masked(value, masker)
    if isinstance(value, (list, tuple)):
        return [_hidden(v, masker) for v in value]
    return value if _looks_numeric(value) else MASK


# --- credential files ------------------------------------------------------------------------------

CREDENTIAL_PATTERNS: tuple[str, ...] = (
    ".ssh/", ".aws/", ".gnupg/", ".env*/", ".azure/",  # whole directories (a virtualenv named .env too)
    ".env*", "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*",  # dotenv files, SSH keys
    "*.pem", "*.key", "*.p12", "*.pfx", "*.ppk",  # private keys (PuTTY's too) and certificate bundles
    ".netrc", "_netrc", ".git-credentials", ".npmrc", ".pypirc", ".dockercfg", "credentials.json",
    ".docker/config.json", ".kube/config", ".vault-token",
    # the canonical credential files of the clouds and hubs, wherever a copy of the home lies:
    "credentials", ".boto", ".s3cfg",  # AWS's shared credentials file (aws/credentials too), boto, s3cmd
    "application_default_credentials.json", "gcloud/credentials.db", "gcloud/access_tokens.db",
    "gcloud/legacy_credentials/",  # GCP
    "huggingface/token", "huggingface/stored_tokens",  # Hugging Face (~/.cache/huggingface)
)


def credential_pattern(path: str, is_dir: bool = False) -> str | None:
    """The CREDENTIAL_PATTERNS entry `path` (a '/'-separated relative path) matches, or None."""
    parts = path.lower().split("/")
    for pattern in CREDENTIAL_PATTERNS:
        if pattern.endswith("/") == is_dir:
            tail = pattern.rstrip("/").split("/")
            if len(parts) >= len(tail) and all(map(fnmatchcase, parts[-len(tail):], tail)):
                return pattern
    return None


# --- this process's secrets (the training container's bootstrap) -------------------------------

_installed = Masker()


def install(masker: Masker) -> None:
    """Make `masker` the one every line this process prints goes through (see `installed`)."""
    global _installed
    _installed = masker


def installed() -> Masker:
    """The masker `install` set; one that masks URL passwords only before any was installed."""
    return _installed

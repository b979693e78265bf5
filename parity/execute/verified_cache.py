"""The harness's on-disk caches ($PARITY_CACHE/<kind>, default ~/.cache/parity/<kind>): entries
verified on load, written by rename. Used by the oracle, FLA's records and TPU compiles.

An entry is one .npz file: its arrays (bfloat16 and other ml_dtypes stored as their bits, the
dtype named beside them), optionally a JSON document (`meta`), the key it was written under
(KEY_KEY) and the sha256 of its contents (CONTENT_KEY: cases.input_hash of the arrays, then of the
meta text when there is one). A truncated, bit-flipped or edited entry, or one written under another
key, is never used: `lookup` warns (CacheWarning) and answers None, and the caller recomputes and
writes it again (`write`). Writers write a file of their own and rename it into place: concurrent
writers of one entry cannot corrupt it. PARITY_FRESH=1 (`parity run --fresh`) makes every lookup
miss; PARITY_FRESH=fla,tpu_compile those kinds' lookups.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
import warnings
from pathlib import Path

import numpy as np

from cases import input_hash
from parity.model import environ

CONTENT_KEY = "__content_sha256__"
KEY_KEY = "__cache_key__"
META_KEY = "__meta__"
DTYPES_KEY = "__dtypes__"  # name -> dtype name, for arrays stored as their bits (bfloat16)


class CacheWarning(UserWarning):
    """A damaged cache entry was not used: recomputed and replaced."""


@dataclasses.dataclass
class Entry:
    arrays: dict[str, np.ndarray]
    meta: dict | None
    path: Path


def cache_dir(kind: str) -> Path:
    """$PARITY_CACHE/<kind> (default ~/.cache/parity/<kind>)."""
    root = os.environ.get("PARITY_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "parity")
    return Path(root) / kind


KINDS = ("oracle", "fla", "tpu_compile")  # the caches written through this module


def key_of(parts: dict) -> str:
    """A cache key: 32 hex digits of the sha256 of `parts` as canonical JSON."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _content(arrays: dict[str, np.ndarray], meta_text: str | None) -> str:
    h = input_hash(arrays)
    return h if meta_text is None else hashlib.sha256(f"{h}|{meta_text}".encode()).hexdigest()


def read(path: Path, key: str) -> Entry:
    """The verified entry at `path`; ValueError saying why when it is damaged or not `key`'s."""
    try:
        with np.load(path, allow_pickle=False) as z:
            names = [n for n in z.files if not n.startswith("__")]
            arrays = {n: z[n] for n in names}
            stored, stored_key = str(z[CONTENT_KEY]), str(z[KEY_KEY])
            meta_text = str(z[META_KEY]) if META_KEY in z.files else None
            dtypes = json.loads(str(z[DTYPES_KEY])) if DTYPES_KEY in z.files else {}
        for name, dtype in dtypes.items():
            import ml_dtypes  # late: only entries holding bfloat16 need it

            arrays[name] = arrays[name].view(getattr(ml_dtypes, dtype))
        meta = None if meta_text is None else json.loads(meta_text)
    except Exception as e:  # noqa: BLE001 - BadZipFile, EOFError, KeyError, OSError, zlib, JSON errors...
        raise ValueError(f"unreadable ({type(e).__name__}: {e})") from None
    if stored_key != key:
        raise ValueError(f"written under key {stored_key[:12]}..., not {key[:12]}...")
    if _content(arrays, meta_text) != stored:
        raise ValueError("content hash does not match the entry")
    return Entry(arrays, meta, path)


def lookup(path: Path, key: str, what: str, warning: type[CacheWarning] = CacheWarning) -> Entry | None:
    """The verified entry at `path` (under cache_dir(kind)), or None: absent, ignored (PARITY_FRESH
    names its kind, or is 1), or damaged (then a `warning` naming `what`, e.g. "oracle cache entry
    <path> for <case>", and why)."""
    if environ.fresh(path.parent.name) or not path.exists():
        return None
    try:
        return read(path, key)
    except ValueError as e:
        warnings.warn(warning(f"{what} is damaged ({e}): recomputed and replaced"), stacklevel=3)
        return None


def write(path: Path, key: str, arrays: dict[str, np.ndarray], meta: dict | None = None) -> None:
    """Write the entry to a file of its own and rename it to `path`. meta: JSON-able (TypeError if not)."""
    meta_text = None if meta is None else json.dumps(meta, sort_keys=True)
    stored = {}
    dtypes = {}
    for name, a in arrays.items():
        a = np.ascontiguousarray(a)
        if a.dtype.kind == "V" or a.dtype.name == "bfloat16":  # ml_dtypes: numpy's .npy names them void
            dtypes[name] = a.dtype.name
            a = a.view(f"u{a.dtype.itemsize}")
        stored[name] = a
    extra = {CONTENT_KEY: np.array(_content(arrays, meta_text)), KEY_KEY: np.array(key)}
    if meta_text is not None:
        extra[META_KEY] = np.array(meta_text)
    if dtypes:
        extra[DTYPES_KEY] = np.array(json.dumps(dtypes))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".tmp-{os.getpid()}-", suffix=".npz")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **stored, **extra)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise

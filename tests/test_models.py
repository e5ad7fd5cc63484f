"""Model plumbing (depthlib.models): the architecture table per family, the hook context manager, loading paths.

Tiny randomly initialised models of every family (GPT-2, OPT, GPT-NeoX, Llama, Gemma 3) come from ``tests/tiny.py``
(transformers configs, seconds, no downloads).
"""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from depthlib import InputError  # noqa: E402
from depthlib.models import arch_of, block_output, hooks, supported_architectures  # noqa: E402
from tests import tiny  # noqa: E402

VOCAB = 97


#: tiny.ARCHS name -> (config.model_type, family shown by arch_of)
FAMILIES = {
    "gpt2": ("gpt2", "GPT-2"),
    "opt": ("opt", "OPT"),
    "neox": ("gpt_neox", "GPT-NeoX / Pythia"),
    "llama": ("llama", "Llama / SmolLM2 / Mistral"),
    "gemma3": ("gemma3_text", "Gemma 3 (text)"),
}


@pytest.fixture(scope="module", params=tiny.ARCHS)
def family(request):
    model_type, name = FAMILIES[request.param]
    return request.param, tiny.model(request.param, VOCAB, layers=3), model_type, name


# ---- the architecture table -------------------------------------------------------------------------
def test_table_knows_every_tested_family():
    assert set(tiny.ARCHS) == set(FAMILIES)
    assert {model_type for model_type, _ in FAMILIES.values()} <= set(supported_architectures())


def test_arch_of_every_family(family):
    key, model, model_type, name = family
    arch = arch_of(model)
    assert (arch.model_type, arch.name, arch.n_layers) == (model_type, name, 3)
    assert arch.d_model == model.config.hidden_size
    assert arch.lm_head is model.get_output_embeddings() and arch.vocab_size == VOCAB
    assert arch.embed is model.get_input_embeddings()
    for i in range(arch.n_layers):
        assert arch.mlp_of(i) is not None and arch.attn_of(i) is not None
        assert arch.mlp_of(i) is not arch.attn_of(i)


def test_unembed_of_the_last_block_output_is_the_models_logits(family):
    """h_L (the last block's output, before the final norm) through ``arch.unembed`` gives the model's logits."""
    key, model, _, _ = family
    arch = arch_of(model)
    ids = torch.randint(1, VOCAB, (2, 7), generator=torch.Generator().manual_seed(0))
    seen = {}

    def grab(module, args, output):
        seen["h"] = block_output(output)

    with torch.no_grad(), hooks([(arch.layers[-1], grab)]):
        logits = model(input_ids=ids, use_cache=False).logits
    torch.testing.assert_close(arch.unembed(seen["h"]), logits, atol=1e-5, rtol=1e-5)


def test_sublayer_outputs_and_opt_flattening(family):
    """MLP and attention outputs are (B, T, d) in every family but OPT, whose ``fc2`` sees (B·T, d)."""
    key, model, _, _ = family
    arch = arch_of(model)
    d = arch.d_model
    shapes = {}

    def grab(name):
        def hook(module, args, output):
            shapes[name] = tuple(block_output(output).shape)
        return hook

    ids = torch.randint(1, VOCAB, (2, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), hooks([(arch.mlp_of(1), grab("mlp")), (arch.attn_of(1), grab("attn"))]):
        model(input_ids=ids, use_cache=False)
    assert shapes["attn"] == (2, 5, d)
    assert shapes["mlp"] == ((10, d) if key == "opt" else (2, 5, d))


def test_unknown_architecture_lists_supported():
    class Fake(torch.nn.Module):
        config = type("C", (), {"model_type": "mamba"})()
    with pytest.raises(InputError, match="unsupported architecture 'mamba'.*gpt_neox.*llama"):
        arch_of(Fake())


# ---- hooks ------------------------------------------------------------------------------------------
def _counts(module: torch.nn.Module) -> tuple[int, int]:
    return len(module._forward_hooks), len(module._forward_pre_hooks)


def test_hooks_fire_and_are_removed():
    lin = torch.nn.Linear(3, 3)
    calls = []
    with hooks([(lin, lambda m, a, out: out * 0)]) as handles:
        assert len(handles) == 1 and _counts(lin) == (1, 0)
        assert torch.count_nonzero(lin(torch.ones(1, 3))) == 0  # a forward hook may replace the output
    assert _counts(lin) == (0, 0) and torch.count_nonzero(lin(torch.ones(1, 3))) > 0
    with hooks([(lin, lambda m, args, kwargs: calls.append(sorted(kwargs)))], kind="forward_pre", with_kwargs=True):
        lin(input=torch.ones(1, 3))
    assert calls == [["input"]] and _counts(lin) == (0, 0)


def test_hooks_are_removed_when_the_body_raises():
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    with pytest.raises(RuntimeError, match="boom"):
        with hooks([(a, lambda *x: None), (b, lambda *x: None)]), hooks([(a, lambda *x: None)], kind="forward_pre"):
            assert _counts(a) == (1, 1) and _counts(b) == (1, 0)
            raise RuntimeError("boom")
    assert _counts(a) == (0, 0) and _counts(b) == (0, 0)


def test_hooks_are_removed_when_a_hook_raises_inside_the_forward():
    lin = torch.nn.Linear(2, 2)

    def bad(module, args, output):
        raise ValueError("hook failed")

    with pytest.raises(ValueError, match="hook failed"), hooks([(lin, bad)]):
        lin(torch.ones(1, 2))
    assert _counts(lin) == (0, 0)


def test_hooks_registered_before_a_failing_registration_are_removed():
    lin = torch.nn.Linear(2, 2)
    with pytest.raises(AttributeError):
        with hooks([(lin, lambda *x: None), ("not a module", lambda *x: None)]):
            pass  # pragma: no cover - never reached
    assert _counts(lin) == (0, 0)
    with pytest.raises(ValueError, match="forward_pre"):
        with hooks([(lin, lambda *x: None)], kind="backward"):
            pass  # pragma: no cover
    assert _counts(lin) == (0, 0)


# ---- loading ----------------------------------------------------------------------------------------
def test_converted_models_live_in_the_cache_dir(tmp_path, monkeypatch):
    from depthlib.models import OFFLINE_MODELS, converted_model_dir
    monkeypatch.setenv("DEPTHLIB_CACHE_DIR", str(tmp_path))
    assert set(OFFLINE_MODELS) == {"gemma-3-270m", "smollm2-135m"}
    assert converted_model_dir("gemma-3-270m") == tmp_path / "models" / "gemma-3-270m"


def test_load_model_checks_its_arguments():
    from depthlib.models import load_model
    with pytest.raises(InputError, match="unknown model 'gpt-17'"):
        load_model("gpt-17")
    with pytest.raises(InputError, match="dtype"):
        load_model("smollm2-135m", dtype="int3")
    with pytest.raises(InputError, match="registry name"):
        load_model("")


def test_load_model_from_a_local_folder(tmp_path):
    from depthlib.models import load_model
    folder = tiny.save_model(tmp_path / "tiny", "gemma3", layers=2)
    model, tok = load_model(str(folder))
    assert not model.training and tok.pad_token is not None and arch_of(model).n_layers == 2

"""Causal tracing (paper §6, Fig. 6) on tiny random models built here (seconds, no files).

Most tests run on GPT-NeoX and Llama; restoration of every kind is also checked on GPT-2, OPT and Gemma 3
(``tests/tiny.py``).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from depthlib import tracing
from depthlib.errors import InputError
from depthlib.models import arch_of, hooks
from tests import tiny

TEXTS = ["The Space Needle is in downtown Seattle.", "The Eiffel Tower is located in the city of Paris.",
         "Steve Jobs was the co-founder of Apple.", "The capital of Japan is Tokyo."] * 20
PROMPT, SUBJECT, TARGET = "The Space Needle is in downtown", "Space Needle", " Seattle"


def _tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(TEXTS, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>")


@pytest.fixture(scope="module")
def tok():
    return _tokenizer()


def _neox(tok, layers=4):
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM
    cfg = GPTNeoXConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=layers, num_attention_heads=4,
                        intermediate_size=256, max_position_embeddings=128, rotary_pct=0.25,
                        use_parallel_residual=True, tie_word_embeddings=False)
    torch.manual_seed(0)
    return GPTNeoXForCausalLM(cfg).eval()


def _llama(tok, layers=6):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=layers, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=128, max_position_embeddings=128)
    torch.manual_seed(1)
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module", params=["neox", "llama"])
def model(request, tok):
    return _neox(tok) if request.param == "neox" else _llama(tok)


def test_locate_subject_and_target_by_characters(tok):
    loc = tracing.locate(tok, PROMPT, SUBJECT, TARGET)
    a, b = loc.subject_range
    assert "".join(loc.tokens[a:b]).strip() == SUBJECT
    assert loc.text == PROMPT and loc.target == TARGET
    assert tok.decode([loc.target_id]).strip() == "Seattle"[: len(tok.decode([loc.target_id]).strip())]
    # the paper's form: the target ends the sentence
    paper = tracing.locate(tok, PROMPT + TARGET, SUBJECT, "Seattle")
    assert paper.text == PROMPT and paper.target_id == loc.target_id
    assert paper.subject_range == loc.subject_range
    roles = loc.roles()
    assert roles[b - 1] == "last subject" and roles[-1] == "last token" and roles[b] == "first subsequent"


@pytest.mark.parametrize("subject,target", [("Golden Gate", None), ("", None), (SUBJECT, "  ")])
def test_bad_subject_or_target_is_an_input_error(tok, subject, target):
    with pytest.raises(InputError):
        tracing.locate(tok, PROMPT, subject, target)


def test_window_clips_at_the_ends():
    assert tracing.window_layers(0, 12, 10) == range(0, 5)
    assert tracing.window_layers(11, 12, 10) == range(6, 12)
    assert tracing.window_layers(5, 12, 10) == range(0, 10)
    assert tracing.window_layers(3, 4, 1) == range(3, 4)
    assert tracing.window_layers(2, 4, 100) == range(0, 4)
    with pytest.raises(InputError):
        tracing.window_layers(0, 4, 0)


def test_window_restores_exactly_the_clipped_layers(tok):
    model = _neox(tok, layers=6)
    cfg = tracing.TraceConfig(samples=2, noise=3.0, window=4, seed=5)
    tr = tracing.CausalTracer(model, tok, cfg).trace(PROMPT, SUBJECT, TARGET, kinds=("mlp",))["mlp"]
    loc = tracing.locate(tok, PROMPT, SUBJECT, TARGET)
    clean, _ = tracing.clean_states(model, loc.input_ids, ("mlp",))
    noise = tracing.subject_noise(loc, 64, 2, 3.0, seed=5)
    t = loc.subject_range[1] - 1
    for layer, layers in [(0, [0, 1]), (5, [3, 4, 5]), (2, [0, 1, 2, 3])]:
        assert list(tracing.window_layers(layer, 6, 4)) == layers
        restore = torch.zeros(2, 6, loc.n_tokens, dtype=torch.bool)
        restore[:, layers, t] = True
        p = tracing.patched_probs(model, loc.input_ids, loc.target_id, noise=noise, kind="mlp",
                                  restore=restore, clean=clean["mlp"]).mean()
        assert tr.grid[layer, t] == pytest.approx(float(p), rel=1e-5)


def test_restoring_every_site_gives_p_clean(model, tok):
    arch = arch_of(model)
    loc = tracing.locate(tok, PROMPT, SUBJECT, TARGET)
    clean, logits = tracing.clean_states(model, loc.input_ids, ("block",))
    p_clean = float(torch.softmax(logits, -1)[loc.target_id])
    noise = tracing.subject_noise(loc, arch.d_model, 3, 5.0, seed=0)
    p_corrupt = tracing.patched_probs(model, loc.input_ids, loc.target_id, noise=noise)
    assert not torch.allclose(p_corrupt, torch.full_like(p_corrupt, p_clean), atol=1e-4)  # the noise matters
    every = torch.ones(3, arch.n_layers, loc.n_tokens, dtype=torch.bool)
    p_all = tracing.patched_probs(model, loc.input_ids, loc.target_id, noise=noise, kind="block",
                                  restore=every, clean=clean["block"])
    np.testing.assert_allclose(p_all.numpy(), p_clean, rtol=1e-5, atol=1e-7)
    # the whole last block output restored is enough too
    last = torch.zeros_like(every)
    last[:, -1] = True
    p_last = tracing.patched_probs(model, loc.input_ids, loc.target_id, noise=noise, kind="block",
                                   restore=last, clean=clean["block"])
    np.testing.assert_allclose(p_last.numpy(), p_clean, rtol=1e-5, atol=1e-7)


def test_zero_noise_gives_p_corrupt_equal_p_clean(model, tok):
    tracer = tracing.CausalTracer(model, tok, tracing.TraceConfig(samples=2, noise=0.0))
    traces = tracer.trace(PROMPT, SUBJECT, TARGET, kinds=tracing.KINDS)
    for tr in traces.values():
        assert tr.p_corrupt == pytest.approx(tr.p_clean, rel=1e-5)
        np.testing.assert_allclose(tr.grid, tr.p_clean, rtol=1e-5)


@pytest.mark.parametrize("kind", tracing.KINDS)
def test_batched_restore_equals_one_site_at_a_time(model, tok, kind):
    cfg = tracing.TraceConfig(samples=3, noise=3.0, window=3 if kind != "block" else None, seed=7)
    tracer = tracing.CausalTracer(model, tok, cfg)
    tr = tracer.trace(PROMPT, SUBJECT, TARGET, kinds=(kind,))[kind]
    loop = tracing.naive_grid(model, tok, PROMPT, SUBJECT, TARGET, kind=kind, config=cfg, sigma=3.0)
    np.testing.assert_allclose(tr.grid, loop, rtol=1e-4, atol=1e-7)
    # small batches (chunked rows) give the same numbers
    small = tracing.CausalTracer(model, tok, tracing.TraceConfig(**{**cfg.__dict__, "max_batch": 2}))
    np.testing.assert_allclose(small.trace(PROMPT, SUBJECT, TARGET, kinds=(kind,))[kind].grid, tr.grid,
                               rtol=1e-4, atol=1e-7)


def test_block_restore_at_last_layer_and_last_token_is_p_clean(model, tok):
    tr = tracing.CausalTracer(model, tok, tracing.TraceConfig(samples=2, noise=4.0)).trace(PROMPT, SUBJECT, TARGET)["block"]
    assert tr.grid[-1, -1] == pytest.approx(tr.p_clean, rel=1e-5)
    a = tr.subject_range[0]
    np.testing.assert_allclose(tr.grid[:, :a], tr.p_corrupt)  # before the subject: nothing to restore
    eff = tr.effect
    assert eff[-1, -1] == pytest.approx(1.0, abs=1e-4)


def test_seeded_noise_is_reproducible(model, tok):
    cfg = tracing.TraceConfig(samples=2, noise=2.0, seed=3)
    a = tracing.CausalTracer(model, tok, cfg).trace(PROMPT, SUBJECT, TARGET)["block"]
    b = tracing.CausalTracer(model, tok, cfg).trace(PROMPT, SUBJECT, TARGET)["block"]
    np.testing.assert_array_equal(a.grid, b.grid)


def test_noise_presets(model, tok):
    arch = arch_of(model)
    w = arch.embed.weight.detach().double()
    assert tracing.noise_sigma(model, tok, "paper") == pytest.approx(3 * float(w.std()), rel=1e-6)
    facts = tracing.load_facts()[:5]
    rome = tracing.noise_sigma(model, tok, "rome", facts)
    assert rome > 0 and np.isfinite(rome)
    assert tracing.noise_sigma(model, tok, "0.5") == 0.5
    for bad in ("loud", -1.0, float("nan")):
        with pytest.raises(InputError):
            tracing.noise_sigma(model, tok, bad)


def test_positions_by_role_and_table(model, tok):
    tracer = tracing.CausalTracer(model, tok, tracing.TraceConfig(samples=2, noise=2.0))
    tr = tracer.trace(PROMPT, SUBJECT, TARGET, kinds=("attn",), positions="last subject,last token")["attn"]
    df = tr.table()
    assert set(df["role"]) == {"last subject", "last token"}
    assert len(df) == 2 * tr.n_layers
    assert df["depth"].max() == pytest.approx(1.0)
    full = tracer.trace(PROMPT, SUBJECT, TARGET, kinds=("attn",))["attn"]
    cols = [tr.subject_range[1] - 1, len(tr.tokens) - 1]
    np.testing.assert_allclose(tr.grid[:, cols], full.grid[:, cols], rtol=1e-5)
    json.dumps(tr.summary())
    with pytest.raises(InputError):
        tracer.trace(PROMPT, SUBJECT, TARGET, positions="middle of nowhere")
    with pytest.raises(InputError):
        tracer.trace(PROMPT, SUBJECT, TARGET, kinds=("resid",))


def test_fact_set_file_and_average(model, tok):
    facts = tracing.load_facts()
    assert len(facts) >= 50
    assert len({f.id for f in facts}) == len(facts)
    for f in facts:  # every committed fact locates its subject and target
        tracing.locate(tok, f.prompt, f.subject, f.target)
    tracer = tracing.CausalTracer(model, tok, tracing.TraceConfig(samples=2, noise=3.0))
    table = tracing.trace_facts(tracer, facts[:3], kinds=("block",))
    avg = tracing.average_effect(table)
    assert set(avg["role"]) <= {"last subject", "last token"}
    assert (avg["n_facts"] <= 3).all()
    check = tracing.check_facts(model, tok, facts[:3])
    assert list(check.columns)[:3] == ["id", "relation", "prompt"] and check["rank"].min() >= 1


@pytest.mark.slow
def test_gemma_space_needle():
    from depthlib.models import load_model
    model, tok = load_model("gemma-3-270m", dtype=torch.float32)
    facts = tracing.load_facts()
    tracer = tracing.CausalTracer(model, tok, tracing.TraceConfig(samples=2), facts=facts)
    tr = tracer.trace(PROMPT, SUBJECT, TARGET, kinds=("block",), positions="last subject,last token")["block"]
    assert tr.target == " Seattle"
    assert 0.4 < tr.p_clean < 0.8
    assert tr.p_corrupt < 0.2
    last_subject, last = tr.subject_range[1] - 1, len(tr.tokens) - 1
    # early-to-middle layers carry it at the subject, late layers at the last token (Fig. 6)
    assert np.nanmax(tr.grid[: tr.n_layers // 2, last_subject]) > tr.p_corrupt + 0.1
    assert tr.grid[-1, last] == pytest.approx(tr.p_clean, rel=1e-4)


def test_cli_trace_json_and_bad_input(tok, tmp_path, capsys):
    from depthlib.cli import main
    folder = tmp_path / "tiny"
    _neox(tok).save_pretrained(folder)
    tok.save_pretrained(folder)
    args = ["tracing", "--model", str(folder), "--prompt", PROMPT, "--subject", SUBJECT, "--target", TARGET,
            "--samples", "2", "--kind", "mlp", "--noise", "2.5", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kind"] == "mlp" and out["window"] == 10 and out["samples"] == 2 and out["sigma"] == 2.5
    assert len(out["grid"]) == 4 and len(out["grid"][0]) == len(out["tokens"])
    assert 0 <= out["p_corrupt"] <= 1 and 0 <= out["p_clean"] <= 1
    for bad in (["--subject", "Golden Gate"], ["--samples", "0"], ["--noise", "loud"], ["--window", "0"]):
        argv = list(args)
        if bad[0] in argv:
            argv[argv.index(bad[0]) + 1] = bad[1]
        else:
            argv += bad
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "error" in err and len(err.strip().splitlines()) == 1


def test_figures_build_from_tidy_tables(model, tok):
    from depthlib.plots import tracing as tplots
    tracer = tracing.CausalTracer(model, tok, tracing.TraceConfig(samples=2, noise=3.0), name="tiny")
    frames = []
    for prompt, subject, target in [(PROMPT, SUBJECT, TARGET), ("Steve Jobs was the co-founder of", "Steve Jobs", " Apple")]:
        frames += [tr.table() for tr in tracer.trace(prompt, subject, target, kinds=tracing.KINDS).values()]
    table = __import__("pandas").concat(frames, ignore_index=True)
    fig = tplots.trace_heatmap(table)
    heat = [t for t in fig.data if t.type == "heatmap"]
    assert len(heat) == 6 and sum(bool(t.visible) for t in heat) == 1
    assert len(fig.layout.updatemenus[0].buttons) == 6
    assert fig.layout.xaxis2.title.text == "normalised depth l/ℓ"
    facts = tracing.load_facts()[:3]
    avg = tracing.average_effect(tracing.trace_facts(tracer, facts, kinds=("block", "mlp")))
    fig2 = tplots.average_effect_figure(avg)
    assert len(fig2.layout.updatemenus[0].buttons) == 2
    names = {t.name.split(" (")[0] for t in fig2.data if t.name}
    assert names == {"last subject token · tiny", "last token · tiny"}
    groups = tracing.functional_groups(tracing.trace_facts(tracer, facts, kinds=("block",)))
    assert len(groups) == 1 and groups["n_layers"].iloc[0] == arch_of(model).n_layers


# ---- every kind on every family (GPT-2, OPT, GPT-NeoX, Llama, Gemma 3) -------------------------------
@pytest.fixture(scope="module", params=tiny.ARCHS)
def family_model(request, tok):
    return tiny.model(request.param, len(tok), layers=3)


def _with_clean_outputs(model, ids, noise_row, kind, clean_run_outputs, target_id) -> float:
    """Reference: p(target) of a noisy one-row forward whose ``kind`` modules return their recorded clean outputs
    (the raw objects the modules returned in the clean run, whatever their shape: no reshaping here)."""
    arch = arch_of(model)
    pairs = [(tracing.site_module(arch, kind, layer), lambda m, a, out, clean=clean: clean)
             for layer, clean in enumerate(clean_run_outputs)]
    add = [(arch.embed, lambda m, a, out: out + noise_row)]
    with torch.no_grad(), hooks(add), hooks(pairs):
        logits = model(input_ids=ids, use_cache=False).logits[:, -1]
    return float(torch.softmax(logits.float(), -1)[0, target_id])


@pytest.mark.parametrize("kind", tracing.KINDS)
def test_restoring_every_site_or_none_on_every_family(family_model, tok, kind):
    model = family_model
    arch = arch_of(model)
    loc = tracing.locate(tok, PROMPT, SUBJECT, TARGET)
    ids, target, L, T = loc.input_ids, loc.target_id, arch.n_layers, loc.n_tokens
    clean, logits = tracing.clean_states(model, ids, (kind,))
    assert clean[kind].shape == (L, T, arch.d_model)  # (layers, tokens, d) in every family, OPT's MLP included
    p_clean = float(torch.softmax(logits.float(), -1)[target])
    noise = tracing.subject_noise(loc, arch.d_model, 2, 8.0, seed=0)
    p_corrupt = tracing.patched_probs(model, ids, target, noise=noise)
    assert not np.allclose(p_corrupt.numpy(), p_clean, rtol=1e-3)  # the noise matters
    nothing = torch.zeros(2, L, T, dtype=torch.bool)
    every = torch.ones(2, L, T, dtype=torch.bool)
    # restoring nothing is the corrupted run
    p_none = tracing.patched_probs(model, ids, target, noise=noise, kind=kind, restore=nothing, clean=clean[kind])
    np.testing.assert_allclose(p_none.numpy(), p_corrupt.numpy(), rtol=1e-6)
    # restoring every site of the clean run into the clean run changes nothing: p_clean
    p_same = tracing.patched_probs(model, ids, target, kind=kind, restore=every[:1], clean=clean[kind])
    np.testing.assert_allclose(p_same.numpy(), p_clean, rtol=1e-5)
    # restoring every site into the corrupted run: block outputs give p_clean; MLP / attention outputs give what a
    # forward whose sublayers return their clean outputs gives (the noise still flows through the residual stream)
    p_all = tracing.patched_probs(model, ids, target, noise=noise, kind=kind, restore=every, clean=clean[kind])
    if kind == "block":
        np.testing.assert_allclose(p_all.numpy(), p_clean, rtol=1e-5)
    else:
        raw = [None] * L
        recorders = [(tracing.site_module(arch, kind, layer), lambda m, a, out, i=layer: raw.__setitem__(i, out))
                     for layer in range(L)]
        with torch.no_grad(), hooks(recorders):
            model(input_ids=ids, use_cache=False)
        ref = [_with_clean_outputs(model, ids, noise[s:s + 1], kind, raw, target) for s in range(2)]
        np.testing.assert_allclose(p_all.numpy(), ref, rtol=1e-5)
        assert not np.allclose(p_all.numpy(), p_corrupt.numpy(), rtol=1e-4)  # restoring did something


@pytest.mark.parametrize("kind", tracing.KINDS)
def test_tracer_equals_the_naive_loop_on_every_family(family_model, tok, kind):
    cfg = tracing.TraceConfig(samples=2, noise=3.0, window=2, seed=7)
    tr = tracing.CausalTracer(family_model, tok, cfg).trace(PROMPT, SUBJECT, TARGET, kinds=(kind,))[kind]
    loop = tracing.naive_grid(family_model, tok, PROMPT, SUBJECT, TARGET, kind=kind, config=cfg, sigma=3.0)
    np.testing.assert_allclose(tr.grid, loop, rtol=1e-4, atol=1e-7)
    still = tracing.CausalTracer(family_model, tok, tracing.TraceConfig(samples=2, noise=0.0, window=2))
    zero = still.trace(PROMPT, SUBJECT, TARGET, kinds=(kind,))[kind]  # no noise: every restored run is clean
    np.testing.assert_allclose(zero.grid, zero.p_clean, rtol=1e-5)


def test_cli_trace_mlp_on_opt(tok, tmp_path, capsys):
    """Regression: `depthlib tracing --kind mlp` on OPT crashed (its fc2 sees (B·T, d) hidden states)."""
    from depthlib.cli import main
    folder = tmp_path / "tiny-opt"
    tiny.model("opt", len(tok), layers=3).save_pretrained(folder)
    tok.save_pretrained(folder)
    assert main(["tracing", "--model", str(folder), "--prompt", PROMPT, "--subject", SUBJECT, "--target", TARGET,
                 "--samples", "2", "--kind", "mlp", "--noise", "3", "--window", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kind"] == "mlp" and len(out["grid"]) == 3 and all(v is not None for v in out["grid"][-1])


# ---- the chapter: profiles, the run it shows, replay -------------------------------------------------
def _knowing_model(tok, folder):
    """A tiny NeoX that 'knows' the first chapter prompt: its unembedding row of the target points along the
    final hidden state of that prompt, so the target is the top-1 prediction."""
    model = _neox(tok)
    prompt, subject, target = tracing.CHAPTER_PROMPTS[0]
    loc = tracing.locate(tok, prompt, subject, target)
    with torch.no_grad():
        h = model.gpt_neox(input_ids=loc.input_ids).last_hidden_state[0, -1]
        model.get_output_embeddings().weight[loc.target_id] = 20 * h / h.norm() ** 2
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def test_chapter_run_replay_and_check_kinds(tok, tmp_path, monkeypatch):
    from depthlib import results
    from depthlib.tracing import chapter
    monkeypatch.setenv("DEPTHLIB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("DEPTHLIB_RESULTS_DIR", str(tmp_path / "committed"))
    name = _knowing_model(tok, tmp_path / "tiny")
    monkeypatch.setitem(chapter.PROFILES, "smoke", chapter.TracingProfile("smoke", (name,), 1, ("block", "mlp"), 2,
                                                                          n_facts=2, n_check=3))
    run = chapter.runs("smoke")["trace"]
    assert run.complete and not run.stale and run.profile == "smoke"
    assert run.manifest["code_modules"] == list(results.compute_modules(*chapter.COMPUTE.values()))
    assert "depthlib.tracing.chapter" not in run.manifest["code_modules"]
    tables = tracing.chapter_tables(run)
    check = tables["check"]
    assert list(check["kind"]) == ["prompt", "fact", "fact", "fact"]
    assert bool(check.loc[check["kind"] == "prompt", "correct"].iloc[0])  # the model knows the chapter prompt
    assert set(tables["prompts"]["kind"]) == {"block", "mlp"}
    assert chapter.runs("smoke")["trace"].path == run.path  # found, not recomputed
    # the one rule only shows a run whose config is the profile's current one
    monkeypatch.setitem(chapter.PROFILES, "smoke", chapter.TracingProfile("smoke", (name,), 1, ("block",), 3))
    assert results.select_run(chapter.EXPERIMENT, "smoke", expected_config=lambda p: chapter.chapter_config(p)) is None
    replayed = tracing.replay(run)
    assert len(replayed) == arch_of(_neox(tok)).n_layers * len(tracing.locate(tok, *tracing.CHAPTER_PROMPTS[0]).tokens)
    np.testing.assert_allclose(replayed["replayed"], replayed["committed"], rtol=1e-6, atol=1e-9)
    assert "kind" in tracing.chapter_tables(run)["check"] and tracing.closing_note(tables).startswith(f"**{name}**")
    with pytest.raises(InputError):
        chapter.runs("huge")


@pytest.mark.slow
def test_gemma_smoke_run_replays(tmp_path, monkeypatch):
    """The smoke run of the chapter (offline Gemma-3-270M and SmolLM2-135M) recomputes to the same heat map. It is
    computed in a results cache of its own (the offline models' conversions are shared, minutes each): a test run
    leaves no run in the checkout's cache, whose runs a smoke build of the book would show."""
    from depthlib import paths
    from depthlib.tracing import chapter
    models = paths.cache_dir() / "models"
    models.mkdir(parents=True, exist_ok=True)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "models").symlink_to(models, target_is_directory=True)
    monkeypatch.setenv("DEPTHLIB_CACHE_DIR", str(tmp_path / "cache"))
    run = chapter.runs("smoke")["trace"]
    assert run.path.is_relative_to(tmp_path)
    replayed = tracing.replay(run)
    assert replayed["committed"].notna().all() and len(replayed) > 0
    np.testing.assert_allclose(replayed["replayed"], replayed["committed"], rtol=1e-5, atol=1e-7)


# ---- noise-only baseline, the late group's step and inputs that were accepted silently ----
def _synthetic_facts(seed_shift: float, n_facts: int = 24, L: int = 12):
    """Fact traces with a smooth early curve at the subject and a one-block jump at the last token, plus noise."""
    import pandas as pd
    rng = np.random.default_rng(int(seed_shift * 1000))
    rows = []
    for f in range(n_facts):
        for layer in range(L):
            subj = 0.6 * np.exp(-((layer - 2) ** 2) / 4)
            last = 0.95 if layer >= 5 else 0.02
            for role, base in (("last subject", subj), ("last token", last)):
                e = base + 0.05 * rng.standard_normal()
                rows.append(dict(model="m", kind="block", fact_id=f"f{f}", layer=layer, depth=(layer + 1) / L,
                                 role=role, effect=e, p=0.1 + 0.8 * e, p_clean=0.9, p_corrupt=0.1))
    return pd.DataFrame(rows)


def test_functional_groups_report_noise_jitter_and_the_late_step():
    a, b = _synthetic_facts(1.0), _synthetic_facts(2.0)
    g = tracing.functional_groups(a, "block", b).iloc[0]
    assert g["late_step_block"] == 6 and g["late_step_from"] < 0.2 and g["late_step_to"] > 0.8
    # the per-fact jitter here is all noise: the noise-only baseline says so (within sampling error)
    assert g["late_jitter_noise"] == pytest.approx(g["late_jitter_fact"], rel=0.35)
    assert g["late_jitter_mean"] < 0.6 * g["late_jitter_fact"]          # averaging alone shrinks it: proves nothing
    assert "late_jitter_noise" not in tracing.functional_groups(a, "block").columns
    note = tracing.closing_note({"prompts": a.iloc[:0], "facts": a, "baseline": b,
                                 "check": a.assign(kind="fact", correct=True, id="f0")[["model", "kind", "correct", "id"]]})
    assert "of noise alone" in note and "jumps" in note


def test_glued_target_warns_and_names_the_scored_token(tok):
    with pytest.warns(UserWarning, match="glued to the prompt's last word"):
        tracing.locate(tok, PROMPT, SUBJECT, "Seattle")


def test_prompt_beyond_the_position_limit_is_refused(tok):
    model = tiny.model("llama", len(tok), layers=2, max_positions=8)
    with pytest.raises(InputError, match="more than the model's limit of 8"):
        tracing.CausalTracer(model, tok, tracing.TraceConfig(samples=1, noise=1.0)).trace(
            PROMPT + " and more words to exceed the limit", SUBJECT, TARGET)


def test_zero_noise_warns(tok):
    model = tiny.model("llama", len(tok), layers=2)
    with pytest.warns(UserWarning, match="corrupts nothing"):
        tracing.noise_sigma(model, tok, 0.0)


# ---- the chapter run as jobs of an executor ------------------------------------------------------------
@pytest.mark.parametrize("kind,cluster", [("serial", "auto"), ("joblib", "auto"), ("submitit", "local"),
                                          ("submitit", "debug")])
def test_sharded_chapter_run_equals_one_process(tok, tmp_path, monkeypatch, kind, cluster):
    """Prompts per model, then the fact set in slices, as units of each executor: the one-process tables, bit for
    bit (both on one torch thread)."""
    import shutil

    import pandas as pd

    from depthlib import executors
    from depthlib.tracing import chapter
    monkeypatch.setenv("DEPTHLIB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("DEPTHLIB_RESULTS_DIR", str(tmp_path / "committed"))
    name = _knowing_model(tok, tmp_path / "tiny")
    monkeypatch.setitem(chapter.PROFILES, "smoke", chapter.TracingProfile("smoke", (name,), 1, ("block",), 2,
                                                                          n_facts=2, n_check=12))
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one = chapter.compute("smoke")
    finally:
        torch.set_num_threads(before)
    tables = {t: one.table(t) for t in one.tables()}
    from depthlib.tracing.facts import safe_name
    assert len(tables[f"facts_{safe_name(name)}"]["fact_id"].unique()) == 2         # the two known: two slices
    shutil.rmtree(one.path)
    merged = chapter.run_sharded("smoke", executors.ExecutorConfig(kind, jobs=2, threads=1, cluster=cluster,
                                                                   shards=2))
    assert merged.path == one.path and merged.manifest["executor"] == kind and len(merged.manifest["shards"]) == 3
    assert sorted(merged.tables()) == sorted(tables)
    for t, table in tables.items():
        pd.testing.assert_frame_equal(merged.table(t), table, check_exact=True, obj=t)

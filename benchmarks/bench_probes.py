"""Benchmark of the hidden-state probe: throughput and peak memory.

Throughput, measured in one run on the same batches, interleaved (the order rotates every batch):

* ``hf_forward``  — ``model(..., output_hidden_states=True)``: the plain forward the paper's scripts start from
  (includes the full-vocabulary logits);
* ``hf_base``     — the decoder alone with ``output_hidden_states=True`` (no logits);
* ``probe``       — :func:`depthlib.probes.probe_documents` without lenses (tap + all angle metrics + streaming
  aggregates + reservoir);
* ``probe+lenses``— the same with the logit and last-block lenses on ``--lens-tokens`` tokens per document.

Target: the angle metrics cost ≤ 1.3× a plain forward.

Memory: ``probe_documents`` on N and 10·N documents in fresh subprocesses; the peak resident memory above the
level reached after loading the model should not grow with N (streaming aggregates, bounded reservoir).

    python benchmarks/bench_probes.py            # 32 docs x 256 tokens; memory 100 vs 1000 docs
    python benchmarks/bench_probes.py --quick    # 8 docs x 128 tokens;  memory 30 vs 300 docs

Prints the numbers and writes benchmarks/out/bench_probes.json. No assertions on time.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out"


def _vm_hwm_mb() -> float:
    """Peak resident set size of this process so far (MB), from /proc (Linux) or getrusage."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _paragraph_docs(n: int):
    """n documents: SOTU paragraphs (> 200 characters), so that 1000 documents exist offline."""
    from depthlib import data
    docs = []
    for d in data.corpus("sotu"):
        for i, para in enumerate(p.strip() for p in d.text.split("\n\n")):
            if len(para) > 200:
                docs.append(data.Document(f"{d.doc_id}:{i}", para))
                if len(docs) == n:
                    return docs
    return docs


def memory_child(model_name: str, n_docs: int, max_length: int, dtype: str, device: str) -> dict:
    import torch
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
    from depthlib import data
    from depthlib.probes import ProbeConfig, probe_documents
    docs = _paragraph_docs(n_docs)
    cfg = ProbeConfig(max_length=max_length, batch_size=8, dtype=dtype, device=device, lenses=False,
                      reservoir_size=5000)
    model, tok = data.load_model(model_name, dtype=cfg.torch_dtype, device=device)
    # warm-up batch so that allocator pools and kernels exist before the baseline is taken
    probe_documents(model, tok, docs[:8], cfg, progress=False)
    base = _vm_hwm_mb()
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    res = probe_documents(model, tok, docs, cfg, progress=False)
    out = dict(n_docs=len(docs), n_tokens=res.info["n_tokens"], seconds=round(time.perf_counter() - t0, 2),
               rss_after_load_and_warmup_mb=round(base, 1), peak_rss_mb=round(_vm_hwm_mb(), 1))
    out["peak_minus_baseline_mb"] = round(out["peak_rss_mb"] - base, 1)
    if device.startswith("cuda"):
        out["cuda_peak_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return out


def throughput(model_name: str, n_docs: int, max_length: int, batch_size: int, dtype: str, device: str,
               lens_tokens: int, reps: int) -> dict:
    import torch

    from depthlib import data
    from depthlib.models.arch import arch_of
    from depthlib.probes import ProbeConfig, probe_documents
    cfg = ProbeConfig(max_length=max_length, batch_size=batch_size, dtype=dtype, device=device, lenses=False)
    cfg_lens = ProbeConfig(max_length=max_length, batch_size=batch_size, dtype=dtype, device=device, lenses=True,
                           lens_tokens_per_doc=lens_tokens)
    model, tok = data.load_model(model_name, dtype=cfg.torch_dtype, device=device)
    arch = arch_of(model)
    tok.padding_side = "right"
    docs = data.corpus("sotu", n_docs)
    batches = [docs[i:i + batch_size] for i in range(0, len(docs), batch_size)]
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def enc(batch):
        e = tok([d.text[: max_length * 16] for d in batch], return_tensors="pt", padding=True, truncation=True,
                max_length=max_length)
        return e["input_ids"].to(device), e["attention_mask"].to(device)

    def hf_forward(batch):
        ids, mask = enc(batch)
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False)

    def hf_base(batch):
        ids, mask = enc(batch)
        with torch.no_grad():
            arch.base(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False)

    methods = {"hf_forward": hf_forward, "hf_base": hf_base,
               "probe": lambda b: probe_documents(model, tok, b, cfg, progress=False),
               "probe+lenses": lambda b: probe_documents(model, tok, b, cfg_lens, progress=False)}
    seconds = {k: 0.0 for k in methods}
    n_valid = 0
    hf_forward(batches[0])  # warm-up
    for rep in range(reps):
        for bi, batch in enumerate(batches):
            names = list(methods)
            shift = (rep * len(batches) + bi) % len(names)
            for name in names[shift:] + names[:shift]:
                sync()
                t0 = time.perf_counter()
                methods[name](batch)
                sync()
                seconds[name] += time.perf_counter() - t0
            if rep == 0:
                n_valid += int(enc(batch)[1][:, 1:].sum())
    tokens = n_valid * reps
    out = {"model": model_name, "dtype": str(cfg.torch_dtype).replace("torch.", ""), "device": device,
           "n_docs": n_docs, "max_length": max_length, "batch_size": batch_size, "reps": reps,
           "valid_tokens_per_rep": n_valid, "lens_tokens_per_doc": lens_tokens,
           "threads": torch.get_num_threads()}
    for name, s in seconds.items():
        out[f"{name}_tokens_per_s"] = round(tokens / s, 1)
    out["ratio_probe_vs_hf_forward"] = round(seconds["probe"] / seconds["hf_forward"], 3)
    out["ratio_probe_vs_hf_base"] = round(seconds["probe"] / seconds["hf_base"], 3)
    out["ratio_probe_lenses_vs_hf_forward"] = round(seconds["probe+lenses"] / seconds["hf_forward"], 3)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--memory-model", default="smollm2-135m", help="model for the memory test (smaller = faster)")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--mmap-threshold", type=int, default=None, metavar="BYTES",
                    help="set glibc's MALLOC_MMAP_THRESHOLD_ in the memory children: large freed blocks then go back "
                         "to the OS, so the peak shows the probe's footprint rather than heap fragmentation")
    ap.add_argument("--memory-child", nargs=2, type=int, metavar=("N_DOCS", "MAX_LENGTH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    import torch
    torch.set_num_threads(args.threads)
    os.environ["BENCH_THREADS"] = str(args.threads)
    if args.memory_child:
        print(json.dumps(memory_child(args.memory_model, *args.memory_child, args.dtype, args.device)))
        return 0

    n_docs, max_length, reps = (8, 128, 2) if args.quick else (32, 256, 2)
    batch = 4 if args.quick else 8
    report = {}
    if not args.skip_throughput:
        report["throughput"] = throughput(args.model, n_docs, max_length, batch, args.dtype, args.device,
                                          lens_tokens=4, reps=reps)
        print(json.dumps(report["throughput"], indent=1), flush=True)
    if not args.skip_memory:
        sizes, mem_len = ((30, 300), 32) if args.quick else ((100, 1000), 32)
        report["memory"] = []
        for n in sizes:
            cmd = [sys.executable, __file__, "--memory-model", args.memory_model, "--dtype", args.dtype,
                   "--device", args.device, "--threads", str(args.threads), "--memory-child", str(n), str(mem_len)]
            env = dict(os.environ)
            if args.mmap_threshold:
                env["MALLOC_MMAP_THRESHOLD_"] = str(args.mmap_threshold)
            res = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
            row = json.loads(res.stdout.strip().splitlines()[-1])
            row["model"] = args.memory_model
            row["malloc_mmap_threshold"] = args.mmap_threshold
            report["memory"].append(row)
            print(json.dumps(row), flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    stem = "bench_probes_quick" if args.quick else "bench_probes"
    if args.skip_throughput:
        stem += "_memory" + (f"_mmap{args.mmap_threshold}" if args.mmap_threshold else "")
    else:
        stem += f"_{args.model.replace('/', '--')}"
    path = OUT / f"{stem}.json"
    path.write_text(json.dumps(report, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Our fact set for causal tracing (package data ``depthlib/tracing/facts/``; its README says how it was made).

A :class:`Fact` is a (prompt, subject, target) triple with an id and a relation. The committed files:
``candidates.jsonl`` (121 candidates written for this project), ``facts.jsonl`` (the candidates the offline
Gemma-3-270M gets right at top-1: the chapter's fact set) and ``check_gemma-3-270m.csv`` (that check).
They ship inside the package (``pyproject.toml``: package-data), so an installed wheel has them too.

``python -m depthlib.tracing facts [MODEL]`` re-makes ``facts.jsonl`` and the check CSV (:func:`build_fact_set`).
"""
from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Sequence

import pandas as pd
import torch

from depthlib import paths
from depthlib.errors import InputError
from depthlib.tracing.locate import locate
from depthlib.tracing.patching import last_logits

FACTS_FILE = "facts.jsonl"
CANDIDATES_FILE = "candidates.jsonl"


def facts_dir() -> Path:
    """The folder of the fact files inside the installed package."""
    return paths.package_file("tracing", "facts")


def facts_path(name: str = FACTS_FILE) -> Path:
    """A committed fact file, ``facts.jsonl`` (the fact set) or ``candidates.jsonl``."""
    return paths.package_file("tracing", "facts", name)


def safe_name(name: str) -> str:
    """A model name or path as a file-name part (``EleutherAI/pythia-410m`` -> ``EleutherAI_pythia-410m``)."""
    return "".join(c if c.isalnum() or c in "-." else "_" for c in name)


@dataclass(frozen=True)
class Fact:
    """One (prompt, subject, target) triple of our fact set."""

    id: str
    relation: str
    prompt: str
    subject: str
    target: str


def load_facts(path: str | Path | None = None) -> list[Fact]:
    """The fact set (default: the packaged ``facts.jsonl``, the facts Gemma-3-270M gets right at top-1)."""
    path = facts_path() if path is None else Path(path)
    if not path.exists():
        raise InputError(f"fact file not found: {path}")
    facts = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            facts.append(Fact(id=str(row["id"]), relation=str(row.get("relation", "")), prompt=row["prompt"],
                              subject=row["subject"], target=row["target"]))
        except (json.JSONDecodeError, KeyError, TypeError):
            raise InputError(f"{path}: line {i + 1} is not a fact (JSON with id, prompt, subject, target)") from None
    return facts


def save_facts(facts: Iterable[Fact], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(asdict(f), ensure_ascii=False) + "\n" for f in facts), encoding="utf-8")
    return path


@torch.no_grad()
def check_facts(model, tokenizer, facts: Sequence[Fact], *, progress: bool = False) -> pd.DataFrame:
    """Does the model know each fact? p and rank of the target's first token at the prediction position.

    One row per fact: id, relation, prompt, target, target_token, p_target, rank (1 = top-1), top1_token, correct.
    """
    device = next(model.parameters()).device
    rows = []
    it = facts
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(facts, desc="check facts", leave=False)
    for fact in it:
        loc = locate(tokenizer, fact.prompt, fact.subject, fact.target)
        logits = last_logits(model, loc.input_ids.to(device))[0].float()
        probs = torch.softmax(logits, -1)
        p = float(probs[loc.target_id])
        rank = int((probs > probs[loc.target_id]).sum()) + 1
        top1 = int(probs.argmax())
        rows.append({"id": fact.id, "relation": fact.relation, "prompt": fact.prompt, "target": fact.target,
                     "target_token": tokenizer.decode([loc.target_id]), "p_target": p, "rank": rank,
                     "top1_token": tokenizer.decode([top1]), "correct": rank == 1})
    return pd.DataFrame(rows)


def known_facts(model, tokenizer, facts: Sequence[Fact]) -> list[Fact]:
    """The facts the model gets right at top-1 (how ``facts.jsonl`` was made from the candidates)."""
    check = check_facts(model, tokenizer, facts)
    keep = set(check.loc[check["correct"], "id"])
    return [f for f in facts if f.id in keep]


def build_fact_set(model_name: str = "gemma-3-270m", *, dtype=torch.float32) -> tuple[list[Fact], pd.DataFrame]:
    """Re-make the committed fact set: check every candidate on ``model_name`` (fp32) and keep the top-1 ones.

    ``python -m depthlib.tracing facts`` runs this and rewrites the packaged ``facts.jsonl``.
    """
    from depthlib.models.loading import load_model
    model, tok = load_model(model_name, dtype=dtype)
    candidates = load_facts(facts_path(CANDIDATES_FILE))
    check = check_facts(model, tok, candidates)
    keep = set(check.loc[check["correct"], "id"])
    return [f for f in candidates if f.id in keep], check


def main(argv: list[str] | None = None) -> int:
    """``python -m depthlib.tracing facts [MODEL]``: re-make ``facts.jsonl`` and ``check_MODEL.csv``."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] != ["facts"]:
        print("usage: python -m depthlib.tracing facts [MODEL]   (re-make depthlib/tracing/facts/facts.jsonl)",
              file=sys.stderr)
        return 2
    model_name = argv[1] if len(argv) > 1 else "gemma-3-270m"
    kept, check = build_fact_set(model_name)
    target = save_facts(kept, facts_dir() / FACTS_FILE)
    cols = ["id", "relation", "prompt", "target_token", "p_target", "rank", "top1_token", "correct"]
    check[cols].round({"p_target": 4}).to_csv(facts_dir() / f"check_{safe_name(model_name)}.csv", index=False)
    print(f"{model_name}: {len(kept)} of {len(check)} candidate facts correct at top-1 -> {target}")
    return 0

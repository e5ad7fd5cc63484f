"""One run of chapter 7's compositional positive control: a grammar whose held-out sequences are unseen and
whose target local statistics cannot solve, both of its tasks, every family at depths below and above L, certified.

The paper (Liu et al., arXiv 2602.05970, §5) leaves open whether a target with real hierarchy makes depth compose.
A control for that needs a target that (i) is not memorised — its held-out sequences occur nowhere in what the
members trained on, (ii) is not solved by local statistics — position-specific n-gram tables fitted on as many
sequences stay far above the networks — and (iii) is learnable by the networks within the budget. The random
hierarchy model (Cagnetta, Petrini, Tomasini, Favero & Wyart, Phys. Rev. X 14, 031001, 2024;
:mod:`depthlib.compose.rhm`) has Ω = v·m^((s^L − 1)/(s − 1)) equally likely sequences (:mod:`depthlib.compose.unseen`)
and its local correlations weaken as m/v grows — but so does what a network learns from a given number of samples
(Cagnetta & Wyart, arXiv 2406.00048: the samples needed to resolve the correlations of a deeper level grow as a power
of m). A quick measurement on this project's 2-core machine (n-gram tables fitted on 128 000 sequences, held-out
2 048 (1 024 for L = 5); an untied width-32 member of chapter 7 trained on 96 000–128 000 fresh sequences, 1 500–2 000
steps × 64; the best n-gram over 1 … T − 1 previous leaves; excess over the exact Bayes loss, nats per leaf):

=================  ===========  ==============  ==========================  ==============================
(v, m, s, L)        Ω            Bayes gap       best n-gram (128 k)         network
=================  ===========  ==============  ==========================  ==============================
(8, 2, 2, 4)       2.6·10⁵      1.300           0.022 (11 prev.; 256 k)     0.008 (ℓ = 8, chapter's run)
(8, 4, 2, 4)       8.6·10⁹      0.650           0.103 (5 prev.)             0.114 (ℓ = 4, 128 k seqs.)
(8, 2, 2, 5)       1.7·10¹⁰     1.343           0.077 (11 prev.)            0.056 (ℓ = 6, 96 k seqs.)
**(4, 2, 2, 5)**   8.6·10⁹      0.671           0.038 (11 prev.)            **0.022** (ℓ = 6, 96 k seqs.)
=================  ===========  ==============  ==========================  ==============================

(the Bayes gap is log v minus the Bayes loss, what a predictor can gain over guessing). Chapter 7's first grammar
(8, 2, 2, 4) fails (i): Ω = 262 144, so training covers 39 % of it; its long n-grams memorise it. Raising m to 4 fixes
(i) but fails (iii): at 128 000 sequences a depth-4 member (0.114) does not beat the 5-previous-leaf table (0.103)
(width 64: 0.113). One level more fixes both with m = 2: at L = 5 the sequences are 32 leaves, Ω ≥ 8.6·10⁹ (the
cpu run's three replicates draw at most 647 040 sequences, which a uniform draw of 2 048 held-out ones would share
0.15 of in expectation; the run draws its held-out set among the sequences no member may train on and counts the
overlap exactly after training), the tables starve (the whole-prefix table is *worse* than the 11-leaf one)
and a depth-6 member is already 1.7× below the best table with fewer samples, still falling. v = 4 (m/v = 1/2: a
leaf's right neighbour is one of about m = 2 of v = 4 symbols) beat v = 8 (1.7× against 1.4× below the best table)
and is the cpu grammar. With the cpu profile's own schedule an untied ℓ = 4 member reached 0.036 after its main stage
(64 000 sequences) and 0.019 after two continuations (144 000), half the best table's excess on as many sequences.
These measurements took a few minutes of CPU; the run's ``ngram`` table repeats the baseline on exactly the members'
sample count.

**Tasks** (:mod:`depthlib.compose.certify`): next-leaf prediction (excess over the exact Bayes loss, certified) and
root classification (:mod:`depthlib.compose.roots`: the error 1 − accuracy, certified, and the cross-entropy, whose
Bayes value is 0, recorded beside it; why the error: :mod:`depthlib.compose.certify`); **families**
untied, looped and fully tied (:func:`depthlib.compose.network.schedule`) at effective depths below and above L; **replicates**
differ in initialisation and training samples (replicate r draws the training-stream indices r·span … (r + 1)·span − 1,
its main stage first, then its continuations; every member of a replicate sees the same sequences). Every member is
certified by the book's continuation rule (:data:`depthlib.certificate.GAIN_BELOW`), or reported not certified with
every continuation's gain.

**Members** are chapter 6's model (:mod:`depthlib.compose.network`: GPT-NeoX's parallel block, rotary positions,
Pythia's initialisation; ``model.arch`` in the settings), the book's one transformer stack, with a learned embedding of
each leaf's absolute position (``model.positions``: where a leaf sits in the tree is its position).

**The run is made of units** (:mod:`depthlib.units`, the book's units runner): a unit is one replicate's members of
one task and family (:meth:`HierarchyConfig.cells`, the longest first), trained in its own resumable run — every
finished member's tables are one file in the unit's folder — and committed on its own, so that the run can be
computed over several sittings. The merge (:func:`merge`) adds the grammar's tables, the fits and the exact held-out
check. The merged run's tables:

=================  ==================================================================================================
table              rows
=================  ==================================================================================================
``grammar``        the grammar: v, m, s, L, length, Ω, Bayes loss, log v, the n-gram sample count
``ngram``          per context size (previous leaves, 0 … T − 1): β, held-out loss, excess over Bayes, its s.e.
``root_bayes``     the Bayes root classifier from the first t leaves (t = 0 … T): accuracy, cross-entropy
``members``        task, family, depth, seed, parameters, held-out loss, Bayes loss, excess, accuracy, error, the
                   certified quantity, certified, continuations, gains, steps, samples, seconds, and (leaf) the
                   diagnostics' summary
``root_members``   the root task's members: accuracy, error, cross-entropy, certified
``stages``         every stage of every member (main, c1, c2 …): sample range, initial and final loss, excess, error,
                   the certified value before and after, gain
``curves``         every stage's held-out curve (step, lr, train_loss, val_loss, excess, accuracy)
``layers``         (leaf) θ and θ(Δh) per block; ``lags``: the long-lag cosine; ``clusters``: trajectory clusters
``edits``          chapter 5's edits: next-leaf (delete, swap, permute) and root (delete, swap; Δ accuracy too)
``fit_exponents``  α_ℓ per quantity and family: all depths, without each depth (:mod:`depthlib.compose.fits`)
``fit_stability``  the all-depths α, without ℓ = 1, the drop-one range, shown or why not
``fit_slopes``     local slopes between neighbouring depths with intervals over replicates
``fit_break``      the two-segment change in slope, its break and bootstrap / t intervals
``fit_rounds``     ``fit_stability`` after every round of continuations (each member's best stage so far), with the
                   sequences a member had drawn: whether more training still moves the exponents
``break_rounds``   ``fit_break`` after every round
=================  ==================================================================================================

The manifest records ``held_out_overlap`` (held-out sequences found among every training sequence any member saw,
compared exactly: 0 by construction, checked), ``held_out_replaced`` (held-out draws replaced before training because
some member may train on their sequence), ``replicates``, ``n_sequences`` and ``training_sequences``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from depthlib.compose import fits, ngram, rhm, unseen
from depthlib.compose.certify import TASKS, Certificate, HeldOut, certify_member, train_stage
from depthlib.compose.diagnostics import diagnose
from depthlib.compose.network import FAMILIES, MIN_DEPTH, GrammarModelConfig, build_model, parameter_counts
from depthlib.compose.roots import root_bayes_table, root_edits
from depthlib.compose.train import HELD_OUT_STREAM, PROBE_STREAM, TRAIN_STREAM, GrammarTrainConfig
from depthlib.contract import Profile
from depthlib.errors import InputError
from depthlib.validate import distinct, int_in_range

EXPERIMENT = "compose-hierarchy-lm"
UNITS = "compose-hierarchy-lm-units"
#: a member's tables, ``members`` last
MEMBER_TABLES = ("stages", "curves", "layers", "lags", "clusters", "edits", "members")
#: the order in which the units run: the longest first, as measured on chapter 7's first transformer (a replicate's
#: next-leaf looped and tied members took about twice its untied ones, the root members half as long). On chapter 6's
#: model the committed next-leaf units took 2,107–2,205 s untied, 1,611–1,768 s tied, 1,446–1,611 s looped (one
#: thread each, two workers), so the order is no longer strictly the longest first.
_LONGEST_FIRST = {("leaf", "tied"): 0, ("leaf", "looped"): 1, ("leaf", "untied"): 2, ("root", "looped"): 3,
                  ("root", "tied"): 4, ("root", "untied"): 5}


@dataclass(frozen=True)
class HierarchyConfig(Profile):
    """A run: the grammar, the tasks, families, depths and replicates, the model, the main schedule, the certificate,
    the probe set and the fits' bootstrap."""

    profile: str
    grammar: rhm.RHMConfig = field(default_factory=lambda: rhm.RHMConfig(v=4, m=2, s=2, L=5))
    tasks: tuple = TASKS
    families: tuple = FAMILIES
    depths: tuple = (1, 2, 3, 4, 6, 8)
    seeds: tuple = (0, 1, 2)
    model: GrammarModelConfig = field(default_factory=GrammarModelConfig)     # chapter 6's model
    train: GrammarTrainConfig = field(default_factory=lambda: GrammarTrainConfig(steps=1000, batch_size=64, evals=10,
                                                                   n_held_out=2048))
    certificate: Certificate = field(default_factory=Certificate)
    n_probe: int = 512
    n_permutations: int = 4
    n_bootstrap: int = 1000

    def validate(self) -> "HierarchyConfig":
        self.grammar.validate()
        self.model.validate()
        self.train.validate()
        self.certificate.validate()
        self.certificate.continuation_config(self.train).validate()
        distinct("tasks", self.tasks, at_least=1)
        for t in self.tasks:
            if t not in TASKS:
                raise InputError(f"task must be one of {', '.join(TASKS)}, got {t!r}")
        distinct("families", self.families, at_least=1)
        for f in self.families:
            if f not in FAMILIES:
                raise InputError(f"family must be one of {', '.join(FAMILIES)}, got {f!r}")
        distinct("depths", self.depths, at_least=1)
        for d in self.depths:
            int_in_range("depth", d, 1, 256)
        distinct("seeds", self.seeds, at_least=1)
        for s in self.seeds:
            int_in_range("seed", s, 0, 2**20)
        int_in_range("n_probe", self.n_probe, 8, 1 << 20)
        int_in_range("n_permutations", self.n_permutations, 1, 1000)
        int_in_range("n_bootstrap", self.n_bootstrap, 10, 100_000)
        if not self.units():
            raise InputError("no family has a depth to train (looped members need depth ≥ 3)")
        return self

    @property
    def span(self) -> int:
        """Training sequences one replicate may draw (main stage and every continuation)."""
        return self.certificate.span(self.train)

    def base(self, seed: int) -> int:
        """The first training-stream index of replicate ``seed``."""
        return int(seed) * self.span

    def family_depths(self, family: str) -> list[int]:
        return sorted(int(d) for d in self.depths if d >= MIN_DEPTH[family])

    def units(self) -> list[tuple[int, str, str, int]]:
        """(seed, task, family, depth) of every member."""
        return [(int(s), t, f, d) for s in self.seeds for t in self.tasks for f in self.families
                for d in self.family_depths(f)]

    @property
    def seed(self) -> int:
        """The first replicate (the units runner records it)."""
        return int(self.seeds[0])

    def cells(self) -> list[dict]:
        """One unit per (replicate, task, family), the longest first."""
        cells = [{"seed": int(s), "task": t, "family": f} for s in self.seeds for t in self.tasks
                 for f in self.families if self.family_depths(f)]
        return sorted(cells, key=lambda c: (_LONGEST_FIRST[(c["task"], c["family"])], c["seed"]))



def member_seed(seed: int, task: str, family: str, depth: int) -> int:
    """The initialisation seed of a member: distinct per (replicate, task, family, depth), fixed per config."""
    return int(seed) * 1_000_003 + TASKS.index(task) * 100_003 + FAMILIES.index(family) * 10_007 + int(depth)



def build_member(cfg: HierarchyConfig, seed: int, task: str, family: str, depth: int):
    """A member's network, initialised: a root classifier reads one position more (the last, which sees every leaf:
    :func:`depthlib.compose.roots.root_logits`)."""
    g = cfg.grammar
    return build_model(cfg.model, family, depth, g.v, g.length + (task == "root"), member_seed(seed, task, family, depth))


def training_ranges(cfg: HierarchyConfig) -> list[tuple[int, int]]:
    """Every training-stream index range some member may draw: each replicate's whole span."""
    return [(cfg.base(s), cfg.base(s) + cfg.span) for s in cfg.seeds]


def held_out_sets(cfg: HierarchyConfig) -> tuple[HeldOut, HeldOut]:
    """The held-out set (stream 1; drawn among the sequences no member may train on,
    :func:`depthlib.compose.unseen.unseen_indices`) and the probe set of the diagnostics (stream 2)."""
    grammar = rhm.make_grammar(cfg.grammar)
    idx, replaced = unseen.unseen_indices(grammar, cfg.train.n_held_out, HELD_OUT_STREAM, training_ranges(cfg),
                                          TRAIN_STREAM)
    return (HeldOut.draw(grammar, len(idx), HELD_OUT_STREAM, idx, replaced),
            HeldOut.draw(grammar, cfg.n_probe, PROBE_STREAM))



# ---- a unit: one replicate's members of one task and family --------------------------------------------------
def train_member(cfg: HierarchyConfig, held, probe, seed: int, task: str, family: str, depth: int, *,
                 device: str = "cpu") -> dict[str, pd.DataFrame]:
    """Train, certify and diagnose one member (as :func:`depthlib.compose.hierarchy.train_member`); its tables."""
    grammar = rhm.make_grammar(cfg.grammar)
    model = build_member(cfg, seed, task, family, depth).to(device)
    rec = certify_member(task, model, grammar, cfg.train, cfg.certificate, cfg.base(seed), held)
    model = rec["model"].cpu()
    key = {"task": task, "family": family, "depth": depth, "seed": seed}
    stages, final = rec["stages"], rec["final"]
    member = {**key, **parameter_counts(model), "val_loss": final["val_loss"],
              "bayes": float(held.bayes.mean()) if task == "leaf" else 0.0, "excess": final["excess"],
              "accuracy": final["accuracy"], "error": 1.0 - final["accuracy"] if task == "root" else np.nan,
              "certified_quantity": "excess" if task == "leaf" else "error", "certified": rec["certified"],
              "continuations": len(rec["gains"]), "last_gain": rec["gains"][-1] if rec["gains"] else np.nan,
              "gains": ", ".join(f"{x:+.4f}" for x in rec["gains"]),
              "best_stage": rec["best_stage"], "steps": rec["steps"],
              "samples": int((stages["sample_stop"] - stages["sample_start"]).sum()),
              "seconds": float(stages["seconds"].sum())}
    empty = pd.DataFrame(columns=list(key))
    if task == "leaf":
        diag = diagnose(model, probe.leaves, float(probe.bayes.mean()), n_permutations=cfg.n_permutations, seed=seed)
        member.update(diag["summary"])
        extra = {name: diag[name] for name in ("layers", "lags", "clusters", "edits")}
    else:
        extra = {"layers": empty, "lags": empty, "clusters": empty,
                 "edits": root_edits(model, probe.leaves, probe.roots)}
    return {"members": pd.DataFrame([member]), "stages": stages.assign(**key), "curves": rec["curves"].assign(**key),
            **{name: (t.assign(**key) if len(t) else empty) for name, t in extra.items()}}


def train_unit(cfg: HierarchyConfig, cell: dict, load, save, say, device: str = "cpu") -> tuple[pd.DataFrame, ...]:
    """Every member of one unit (a replicate's members of one task and family), deepest first, each saved as it
    finishes (``load``/``save``: the units runner's, :mod:`depthlib.units`); its tables in :data:`MEMBER_TABLES`
    order."""
    held, probe = held_out_sets(cfg)
    done = {}
    for depth in sorted(cfg.family_depths(cell["family"]), reverse=True):
        tables = load("member", depth)
        if tables is None:
            say(f"depth {depth}")
            tables = train_member(cfg, held, probe, cell["seed"], cell["task"], cell["family"], depth, device=device)
            save("member", depth, tables)
        done[depth] = tables
    return tuple(concat_tables([done[d][name] for d in sorted(done)]) for name in MEMBER_TABLES)


def first_curve(cfg: HierarchyConfig, cell: dict, stop_at: int) -> pd.DataFrame:
    """The main stage of a unit's shallowest member up to the evaluation at ``stop_at`` (a replay)."""
    seed, task, family = cell["seed"], cell["task"], cell["family"]
    depth = min(cfg.family_depths(family))
    held, _ = held_out_sets(cfg)
    curve, _ = train_stage(task, build_member(cfg, seed, task, family, depth), rhm.make_grammar(cfg.grammar),
                           cfg.train, cfg.base(seed), held, stop_at=stop_at)
    return curve.assign(task=task, family=family, depth=depth, seed=seed, stage="main")


# ---- the run: the units merged -------------------------------------------------------------------------------
def grammar_tables(cfg: HierarchyConfig, held: HeldOut) -> dict[str, pd.DataFrame]:
    """The grammar's own tables: the n-gram baselines fitted on a replicate's whole span (the most sequences any member
    sees: first replicate's), the Bayes root classifier by observed prefix, and the grammar's numbers."""
    grammar = rhm.make_grammar(cfg.grammar)
    g = cfg.grammar
    base = cfg.base(cfg.seeds[0])
    train = rhm.sample(grammar, np.arange(base, base + cfg.span), TRAIN_STREAM)
    leaves = held.leaves.numpy()
    omega = unseen.n_sequences(g)
    row = {"v": g.v, "m": g.m, "s": g.s, "L": g.L, "seed": g.seed, "length": g.length,
           "n_sequences": float(omega), "n_sequences_exact": str(omega), "bayes": float(held.bayes.mean()),
           "uniform": float(np.log(g.v)), "ngram_samples": int(cfg.span), "n_held_out": int(len(leaves))}
    return {"ngram": ngram.ngram_table(train, leaves, held.bayes, g.v),
            "root_bayes": root_bayes_table(grammar, leaves, held.roots.numpy()),
            "grammar": pd.DataFrame([row])}



def fit_tables(cfg: HierarchyConfig, members: pd.DataFrame, stages: pd.DataFrame | None = None
               ) -> dict[str, pd.DataFrame]:
    """The fits and their checks (:mod:`depthlib.compose.fits`); with ``stages``, the exponents and the slope change
    after every round of continuations too (``fit_rounds``, ``break_rounds``)."""
    long = fits.quantities(members)
    exps = fits.exponents(long)
    out = {"fit_exponents": exps, "fit_stability": fits.stability(exps), "fit_slopes": fits.local_slopes(long),
           "fit_break": fits.slope_change(long, cfg.grammar.L, cfg.n_bootstrap)}
    if stages is not None:
        out["fit_rounds"], out["break_rounds"] = fits.round_fits(fits.by_round(stages), cfg.grammar.L,
                                                                 cfg.n_bootstrap)
    return out



def merge(cfg: HierarchyConfig, t: dict[str, pd.DataFrame]) -> tuple[dict[str, pd.DataFrame], dict]:
    """The run from its units' tables: the members' tables, the grammar's, ``root_members``, the fits
    (:func:`depthlib.compose.fit_tables`), and the manifest's checks (the exact held-out overlap, the
    replaced draws, the sequences drawn, the summary)."""
    held, _ = held_out_sets(cfg)
    order = ["task", "family", "depth", "seed"]
    merged = {name: (t[name].sort_values(order, kind="stable").reset_index(drop=True) if len(t[name]) else t[name])
              for name in MEMBER_TABLES}
    merged.update(grammar_tables(cfg, held))
    members = merged["members"]
    merged["root_members"] = members[members["task"] == "root"].assign(ce=lambda m: m["excess"])[
        ["family", "depth", "seed", "n_params", "n_blocks", "accuracy", "error", "ce", "certified",
         "continuations", "gains", "steps", "samples"]].reset_index(drop=True)
    merged.update(fit_tables(cfg, members, merged["stages"]))
    check = unseen.held_out_overlap(rhm.make_grammar(cfg.grammar), held.leaves.numpy(),
                                    zip(merged["stages"]["sample_start"], merged["stages"]["sample_stop"]),
                                    TRAIN_STREAM)
    leaf, root = members[members["task"] == "leaf"], members[members["task"] == "root"]
    checks = dict(held_out_overlap=check["found"], held_out_replaced=int(held.replaced),
                  training_sequences=check["training_sequences"], replicates=len(cfg.seeds),
                  n_sequences=str(unseen.n_sequences(cfg.grammar)),
                  expected_overlap=unseen.expected_overlap(cfg.grammar, check["training_sequences"],
                                                           cfg.train.n_held_out),
                  ngram_samples=int(cfg.span),
                  summary={"n_members": int(len(members)), "n_certified": int(members["certified"].sum()),
                           "all_certified": bool(members["certified"].all()),
                           "bayes_loss": float(held.bayes.mean()),
                           "best_ngram_excess": float(merged["ngram"]["excess"].min()),
                           "min_leaf_excess": float(leaf["excess"].min()) if len(leaf) else None,
                           "max_root_accuracy": float(root["accuracy"].max()) if len(root) else None,
                           "train_seconds": float(members["seconds"].sum())})
    return merged, checks


def concat_tables(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """The non-empty ``frames`` one after another (an empty table if none)."""
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()



__all__ = ["EXPERIMENT", "MEMBER_TABLES", "UNITS", "HierarchyConfig", "build_member", "concat_tables", "first_curve",
           "fit_tables", "grammar_tables", "held_out_sets", "member_seed", "merge", "train_member", "train_unit",
           "training_ranges"]

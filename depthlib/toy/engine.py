"""One batched engine that trains many toy students at once (paper App. C; its speed: benchmarks/bench_toy.py).

What is batched:

* **Students.** Every student of a sweep (depth × temperature × ρ × replicate) lives in one set of stacked
  weights. Unit j (an MLP; one per Euler block, two per RK2 block) holds a tensor of shape
  ``(n_j, d, H)`` for the n_j students that are deeper than j. Students are sorted by depth, deepest first,
  so the students active at unit j are a *prefix* of the stack. This is depth mixing by masking — a block
  whose W_down is zero is the identity, so a depth-ℓ student is a depth-48 student whose blocks ℓ..47 are
  masked off — except that the masked blocks are never stored or computed.
* **Teachers.** One teacher forward per step per teacher serves every student that learns from it
  (all depths and temperatures); the logits are re-tempered per student.
* **Data.** One fresh Gaussian batch per data stream (one stream per replicate) per step.

The backward pass is written by hand (no autograd): per unit three batched matmuls forward and four
backward. Adam runs on one flat buffer holding every parameter of every student, with the same
arithmetic as ``torch.optim.Adam`` (single-tensor path). On the CPU, students are processed in chunks of
a few models so the activations stay in cache (measured on this project's 2-core machines); on CUDA one chunk holds everybody.

Reproducibility: all randomness comes from per-stream generators seeded by the caller, so a run is bit
for bit reproducible on one device, and a student's trajectory does not depend on who shares its batch
(tests/test_toy.py checks batched == alone == a plain autograd loop).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from depthlib.errors import InputError
from depthlib.toy.models import StudentTraining, StudentWeights, TeacherWeights, ToyShape, init_student
from depthlib.validate import resolve_device


@dataclass(frozen=True)
class StudentSpec:
    """One student: which teacher it learns from, at which temperature, its depth and its init seed."""

    teacher: int          # index into the engine's teacher list
    temperature: float    # T on the teacher logits (KL variants); ignored by MSE variants
    depth: int            # number of blocks ℓ (RK2 blocks for exp-9-4)
    seed: int             # seed of its initial W_up, b_up


def _rms(h: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm without gain: returns (u = h·inv, inv = 1/√(mean h² + eps))."""
    inv = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return h * inv, inv


def _rms_back(du: torch.Tensor, u: torch.Tensor, inv: torch.Tensor) -> torch.Tensor:
    """Gradient through u = h / rms(h): dh = (du − u · mean(du ⊙ u)) / rms(h)."""
    return (du - u * (du * u).mean(-1, keepdim=True)) * inv


class BatchedStudents:
    """Trains ``len(specs)`` students against ``teachers`` with one optimiser step per :meth:`step` call.

    ``data_seeds[s]`` seeds data stream s; teacher i reads stream ``streams[i]`` (and so do its students).
    ``test_seeds[s]`` seeds the held-out test batches of stream s (drawn once, never trained on).
    """

    def __init__(self, teachers: list[TeacherWeights], specs: list[StudentSpec], train: StudentTraining,
                 total_steps: int, *, streams: list[int] | None = None, data_seeds: list[int] | None = None,
                 test_seeds: list[int] | None = None, batch: int = 1024, eval_batches: int = 10,
                 eval_batch_size: int = 1024, shape: ToyShape = ToyShape(), device: str | None = "cpu",
                 chunk: int | None = None, allow_tf32: bool = False):
        if not specs:
            raise InputError("no students to train")
        if batch < 1 or total_steps < 1:
            raise InputError(f"batch and steps must be >= 1, got batch={batch}, steps={total_steps}")
        self.device = resolve_device(device)
        self.train, self.shape, self.total_steps = train, shape, int(total_steps)
        self.batch, self.eval_batches, self.eval_batch_size = batch, eval_batches, eval_batch_size
        self.allow_tf32 = allow_tf32
        self.dtype = torch.float32
        self.eps = torch.finfo(self.dtype).eps
        self.per_block = 2 if train.block == "rk2" else 1
        n_t = len(teachers)
        self.streams = list(streams) if streams is not None else [0] * n_t
        n_s = max(self.streams) + 1
        data_seeds = list(data_seeds) if data_seeds is not None else list(range(n_s))
        test_seeds = list(test_seeds) if test_seeds is not None else [s + 10_000 for s in data_seeds]
        for s in specs:
            if not 0 <= s.teacher < n_t:
                raise InputError(f"student refers to teacher {s.teacher}, have {n_t}")
            if s.depth < 1:
                raise InputError(f"student depth must be >= 1, got {s.depth}")
            if train.loss == "kl" and not s.temperature > 0:
                raise InputError(f"temperature must be > 0, got {s.temperature}")

        # -- order: deepest first, so the students active at unit j are a prefix -----------------------
        self.specs = list(specs)
        self.order = sorted(range(len(specs)), key=lambda k: (-specs[k].depth, k))
        self.inverse = [0] * len(specs)
        for pos, k in enumerate(self.order):
            self.inverse[k] = pos
        sspecs = [specs[k] for k in self.order]
        self.K = len(specs)
        self.depths = torch.tensor([s.depth for s in sspecs])
        self.n_blocks = int(self.depths.max())
        self.n_active = [int((self.depths > b).sum()) for b in range(self.n_blocks)]  # per block
        self.chunk = self.K if (chunk is None or chunk <= 0) else min(int(chunk), self.K)
        dev = self.device

        # -- teachers, stacked: (ℓ*, n_t, d, H) etc. in bmm layout ------------------------------------
        self.t_Wu = torch.stack([t.W_up.transpose(1, 2) for t in teachers], 1).contiguous().to(dev)
        self.t_b = torch.stack([t.b_up[:, None, :] for t in teachers], 1).contiguous().to(dev)
        self.t_Wd = torch.stack([t.W_down.transpose(1, 2) for t in teachers], 1).contiguous().to(dev)
        head_kind = "fixed" if train.head == "fixed" else "trained"
        self.t_head = torch.stack([(t.fixed_head if head_kind == "fixed" else t.head).T for t in teachers]
                                  ).contiguous().to(dev)                      # (n_t, d, V)
        self.t_stream = torch.tensor(self.streams, device=dev)
        self.s_teacher = torch.tensor([s.teacher for s in sspecs], device=dev)
        self.s_stream = self.t_stream[self.s_teacher]
        self.s_temp = torch.tensor([s.temperature for s in sspecs], dtype=self.dtype, device=dev)

        # -- flat parameter buffer: per unit j, Wu (n_j, d, H), b (n_j, 1, H), Wd (n_j, H, d); then head --
        d, H, V = shape.d_model, shape.d_mlp, shape.vocab
        layout, offset = [], 0
        for j in range(self.n_blocks * self.per_block):
            n = self.n_active[j // self.per_block]
            entry = {}
            for name, shp in (("Wu", (n, d, H)), ("b", (n, 1, H)), ("Wd", (n, H, d))):
                entry[name] = (offset, shp)
                offset += math.prod(shp)
            layout.append(entry)
        self._layout = layout
        self._head_off = None
        if train.head == "trained":
            self._head_off = (offset, (self.K, d, V))
            offset += self.K * d * V
        self.numel = offset
        self.P = torch.zeros(offset, dtype=self.dtype, device=dev)
        self.G = torch.zeros_like(self.P)
        self.m = torch.zeros_like(self.P)
        self.v = torch.zeros_like(self.P)
        self.Wu, self.b, self.Wd = self._views(self.P)
        self.gWu, self.gb, self.gWd = self._views(self.G)
        self.head = self._head_view(self.P)
        self.ghead = self._head_view(self.G)
        if train.head == "fixed":
            self.fixed_head = self.t_head[self.s_teacher].contiguous()          # (K, d, V), frozen

        # -- initial weights, per student from its own seed -------------------------------------------
        for pos, s in enumerate(sspecs):
            w = init_student(s.depth, s.seed, train, shape,
                             fixed_head=teachers[s.teacher].fixed_head if train.head == "fixed" else None)
            for j in range(w.W_up.shape[0]):
                self.Wu[j][pos].copy_(w.W_up[j].T)
                self.b[j][pos, 0].copy_(w.b_up[j])
                self.Wd[j][pos].copy_(w.W_down[j].T)
            if self.head is not None:
                self.head[pos].copy_(w.head.T)
        # -- Adam groups: students of equal depth share a learning rate and are contiguous in every unit
        self._adam_groups = []
        bounds = [0] + [p for p in range(1, self.K) if sspecs[p].depth != sspecs[p - 1].depth] + [self.K]
        for g0, g1 in zip(bounds[:-1], bounds[1:]):
            rows = []
            for j in range(len(layout)):
                n = self.n_active[j // self.per_block]
                if n > g0:
                    rows += [(name, j, g0, min(g1, n)) for name in ("Wu", "b", "Wd")]
            if self.head is not None:
                rows.append(("head", None, g0, g1))
            lists = []
            for bufs in ((self.Wu, self.b, self.Wd, self.head), (self.gWu, self.gb, self.gWd, self.ghead),
                         self._views(self.m) + (self._head_view(self.m),),
                         self._views(self.v) + (self._head_view(self.v),)):
                named = dict(zip(("Wu", "b", "Wd", "head"), bufs))
                lists.append([named[name][a:b] if j is None else named[name][j][a:b] for name, j, a, b in rows])
            step = torch.zeros((), dtype=self.dtype, device=dev)
            self._adam_groups.append((train.base_lr(sspecs[g0].depth), lists, step))

        # -- randomness: one generator per data stream; held-out test batches drawn once ---------------
        self.gens = []
        for seed in data_seeds[:n_s]:
            g = torch.Generator(device=dev)
            g.manual_seed(int(seed))
            self.gens.append(g)
        tests = []
        for seed in test_seeds[:n_s]:
            g = torch.Generator(device=dev)
            g.manual_seed(int(seed))
            tests.append(torch.randn((eval_batches, eval_batch_size, d), generator=g, device=dev))
        self.x_test = torch.stack(tests)                                       # (streams, nb, B_test, d)
        self._test_targets = None
        self.step_count = 0

    # ---- layout helpers ---------------------------------------------------------------------------
    def _views(self, flat):
        out = ([], [], [])
        for entry in self._layout:
            for lst, name in zip(out, ("Wu", "b", "Wd")):
                off, shp = entry[name]
                lst.append(flat[off: off + math.prod(shp)].view(shp))
        return out

    def _head_view(self, flat):
        if self._head_off is None:
            return None
        off, shp = self._head_off
        return flat[off: off + math.prod(shp)].view(shp)

    # ---- teacher --------------------------------------------------------------------------------------
    def teacher_outputs(self, x: torch.Tensor) -> torch.Tensor:
        """Teacher logits before temperature (n_t, B, V), or RMSNorm(h_ℓ*) (n_t, B, d) for MSE.
        ``x`` is (streams, B, d); teacher i reads stream i."""
        h, _ = _rms(x[self.t_stream], self.eps)                                # (n_t, B, d)
        for l in range(self.t_Wu.shape[0]):
            u, _ = _rms(h, self.eps)
            z = torch.baddbmm(self.t_b[l], u, self.t_Wu[l]).relu_()
            h = torch.baddbmm(h, z.mul_(z), self.t_Wd[l])
        y, _ = _rms(h, self.eps)
        return y if self.train.loss == "mse" else torch.bmm(y, self.t_head)

    def _targets(self, t_out: torch.Tensor, c0: int, c1: int) -> torch.Tensor:
        """Per-student targets for students c0..c1 (sorted order): log p_T (n, B, V) or y* (n, B, d)."""
        tgt = t_out[self.s_teacher[c0:c1]]
        if self.train.loss == "mse":
            return tgt
        return torch.log_softmax(tgt / self.s_temp[c0:c1, None, None], -1)

    # ---- student forward / backward ---------------------------------------------------------------
    def _unit_fwd(self, j: int, c0: int, h: torch.Tensor, add_to: torch.Tensor | None = None):
        """One MLP unit on students c0..c0+n: returns add_to + W_down·ReLU(W_up·RMSNorm(h) + b)² and the
        tensors its backward needs (``add_to`` defaults to zero)."""
        n = h.shape[0]
        u, inv = _rms(h, self.eps)
        z = torch.baddbmm(self.b[j][c0:c0 + n], u, self.Wu[j][c0:c0 + n]).relu_()   # (n, B, H)
        g = z * z
        Wd = self.Wd[j][c0:c0 + n]
        out = torch.bmm(g, Wd) if add_to is None else torch.baddbmm(add_to, g, Wd)
        return out, (u, inv, z, g)

    def _unit_bwd(self, j: int, c0: int, saved, dout: torch.Tensor) -> torch.Tensor:
        """Writes this unit's gradients, returns the gradient w.r.t. the unit's input h."""
        u, inv, z, g = saved
        n = z.shape[0]
        torch.bmm(g.transpose(1, 2), dout, out=self.gWd[j][c0:c0 + n])
        # d(relu(a)²)/da = 2·relu(a); the factor 2 is folded into the small W_down (exact: a power of two)
        da = torch.bmm(dout, self.Wd[j][c0:c0 + n].transpose(1, 2) * 2.0).mul_(z)
        torch.sum(da, dim=1, keepdim=True, out=self.gb[j][c0:c0 + n])
        torch.bmm(u.transpose(1, 2), da, out=self.gWu[j][c0:c0 + n])
        du = torch.bmm(da, self.Wu[j][c0:c0 + n].transpose(1, 2))
        return _rms_back(du, u, inv)

    def _n_in_chunk(self, b: int, c0: int, c1: int) -> int:
        return max(0, min(c1, self.n_active[b]) - c0)

    def _forward(self, c0: int, c1: int, h: torch.Tensor, save: bool, states: list | None = None):
        """Residual stream of students c0..c1 from h_0 (n, B, d) to h_ℓ (each at its own depth)."""
        saved, done = [], []
        for blk in range(self.n_blocks):
            n = self._n_in_chunk(blk, c0, c1)
            if n == 0:
                break
            if n < h.shape[0]:
                done.append(h[n:])
                h = h[:n]
            if self.per_block == 1:
                h, s1 = self._unit_fwd(blk, c0, h, add_to=h)
                if save:
                    saved.append((s1,))
            else:
                k1, s1 = self._unit_fwd(2 * blk, c0, h)
                h, s2 = self._unit_fwd(2 * blk + 1, c0, h + 0.5 * k1, add_to=h)
                if save:
                    saved.append((s1, s2))
            if states is not None:
                states.append(h)
        done.append(h)
        return torch.cat(done[::-1]) if len(done) > 1 else h, saved

    def _backward(self, c0: int, c1: int, saved, dhL: torch.Tensor) -> None:
        dh = None
        for blk in range(len(saved) - 1, -1, -1):
            n = self._n_in_chunk(blk, c0, c1)
            if dh is None:
                dh = dhL[:n]
            elif n > dh.shape[0]:
                dh = torch.cat([dh, dhL[dh.shape[0]:n]])
            if self.per_block == 1:
                dh = dh + self._unit_bwd(blk, c0, saved[blk][0], dh)
            else:
                dmid = self._unit_bwd(2 * blk + 1, c0, saved[blk][1], dh)
                dh = dh + dmid + self._unit_bwd(2 * blk, c0, saved[blk][0], 0.5 * dmid)

    def _loss_and_grad(self, c0: int, c1: int, hL: torch.Tensor, target: torch.Tensor, grad: bool):
        """Per-student loss (n,) and, with ``grad``, dL/dh_ℓ (and the head gradient)."""
        B = hL.shape[1]
        y, inv = _rms(hL, self.eps)
        if self.train.loss == "mse":
            diff = y - target
            loss = diff.pow(2).mean((1, 2))
            if not grad:
                return loss, None
            dy = diff * (2.0 / (B * y.shape[2]))
        else:
            temp = self.s_temp[c0:c1, None, None]
            if self.train.head == "trained":
                s = torch.bmm(y, self.head[c0:c1])
            else:
                s = torch.bmm(y, self.fixed_head[c0:c1]) / temp
            logq = torch.log_softmax(s, -1)
            p = target.exp()
            loss = (p * (target - logq)).sum((1, 2)) / B
            if not grad:
                return loss, None
            ds = (logq.exp() - p) / B
            if self.train.head == "trained":
                torch.bmm(y.transpose(1, 2), ds, out=self.ghead[c0:c1])
                dy = torch.bmm(ds, self.head[c0:c1].transpose(1, 2))
            else:
                dy = torch.bmm(ds / temp, self.fixed_head[c0:c1].transpose(1, 2))
        return loss, _rms_back(dy, y, inv)

    # ---- public API ------------------------------------------------------------------------------
    def draw_batch(self) -> torch.Tensor:
        """The next training inputs: (streams, B, d), one fresh Gaussian batch per stream."""
        d = self.shape.d_model
        return torch.stack([torch.randn((self.batch, d), generator=g, device=self.device) for g in self.gens])

    def step(self, x: torch.Tensor | None = None) -> torch.Tensor:
        """One Adam step for every student; returns the training losses (K,) in the caller's order."""
        self._set_tf32()
        with torch.no_grad():
            x = self.draw_batch() if x is None else x.to(self.device)
            t_out = self.teacher_outputs(x)
            losses = torch.empty(self.K, dtype=self.dtype, device=self.device)
            for c0 in range(0, self.K, self.chunk):
                c1 = min(c0 + self.chunk, self.K)
                h0, _ = _rms(x[self.s_stream[c0:c1]], self.eps)
                hL, saved = self._forward(c0, c1, h0, save=True)
                loss, dhL = self._loss_and_grad(c0, c1, hL, self._targets(t_out, c0, c1), grad=True)
                self._backward(c0, c1, saved, dhL)
                losses[c0:c1] = loss
            self._adam()
        self.step_count += 1
        return losses[self.inverse_index]

    @property
    def inverse_index(self) -> torch.Tensor:
        """Positions of the caller's students in the depth-sorted stack."""
        if getattr(self, "_inverse_index", None) is None:
            self._inverse_index = torch.tensor(self.inverse, device=self.device)
        return self._inverse_index

    def _adam(self) -> None:
        """Adam (paper App. C: default betas, eps 1e-8, no weight decay) with PyTorch's fused kernel, one call
        per learning-rate group (students of one depth); the lr follows the variant's schedule."""
        beta1, beta2 = self.train.betas
        sched = self.train.schedule(self.step_count, self.total_steps)
        for base, (params, grads, ms, vs), step in self._adam_groups:
            step.add_(1)
            torch._fused_adam_(params, grads, ms, vs, [], [step] * len(params), lr=base * sched, beta1=beta1,
                               beta2=beta2, weight_decay=0.0, eps=self.train.eps, amsgrad=False, maximize=False)

    def evaluate(self) -> torch.Tensor:
        """Test loss (K,) in the caller's order: mean over the held-out batches (paper App. C: 10 × 1024)."""
        self._set_tf32()
        with torch.no_grad():
            if self._test_targets is None:
                self._test_targets = [self.teacher_outputs(self.x_test[:, i]) for i in range(self.eval_batches)]
            total = torch.zeros(self.K, dtype=torch.float64, device=self.device)
            for i in range(self.eval_batches):
                x = self.x_test[:, i]
                for c0 in range(0, self.K, self.chunk):
                    c1 = min(c0 + self.chunk, self.K)
                    h0, _ = _rms(x[self.s_stream[c0:c1]], self.eps)
                    hL, _ = self._forward(c0, c1, h0, save=False)
                    loss, _ = self._loss_and_grad(c0, c1, hL, self._targets(self._test_targets[i], c0, c1),
                                                  grad=False)
                    total[c0:c1] += loss.double()
        return (total / self.eval_batches).float()[self.inverse_index]

    def export_student(self, k: int) -> StudentWeights:
        """Student k (caller's order) in nn.Linear layout, on the CPU."""
        pos, depth = self.inverse[k], self.specs[k].depth
        M = depth * self.per_block
        W_up = torch.stack([self.Wu[j][pos].T for j in range(M)]).cpu()
        b_up = torch.stack([self.b[j][pos, 0] for j in range(M)]).cpu()
        W_down = torch.stack([self.Wd[j][pos].T for j in range(M)]).cpu()
        if self.train.head == "trained":
            head = self.head[pos].T.cpu().clone()
        elif self.train.head == "fixed":
            head = self.fixed_head[pos].T.cpu().clone()
        else:
            head = None
        return StudentWeights(W_up.clone(), b_up.clone(), W_down.clone(), head)

    # ---- bookkeeping ------------------------------------------------------------------------------
    def flops_per_step(self) -> float:
        """Matmul FLOPs of one training step (2·m·n·k; train = 3× forward; teacher forward once)."""
        d, H, V, B = self.shape.d_model, self.shape.d_mlp, self.shape.vocab, self.batch
        unit = 2 * (d * H + H * d) * B
        units = sum(s.depth for s in self.specs) * self.per_block
        head = (3 if self.train.head == "trained" else 2) * 2 * d * V * B * self.K if self.train.loss == "kl" else 0
        n_t = self.t_Wu.shape[1]
        teacher = n_t * (self.t_Wu.shape[0] * unit + (2 * d * V * B if self.train.loss == "kl" else 0))
        return 3.0 * unit * units + head + teacher

    def _set_tf32(self) -> None:
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = self.allow_tf32

    def state_dict(self) -> dict:
        """Everything needed to resume bit for bit: weights, Adam moments, step, generator states."""
        return {"P": self.P.cpu(), "m": self.m.cpu(), "v": self.v.cpu(), "step": self.step_count,
                "gens": [g.get_state() for g in self.gens]}

    def load_state_dict(self, state: dict) -> None:
        if state["P"].numel() != self.numel:
            raise InputError("checkpoint does not match this sweep's students")
        self.P.copy_(state["P"])
        self.m.copy_(state["m"])
        self.v.copy_(state["v"])
        self.step_count = int(state["step"])
        for _, _, step in self._adam_groups:
            step.fill_(self.step_count)
        for g, s in zip(self.gens, state["gens"]):
            g.set_state(s)

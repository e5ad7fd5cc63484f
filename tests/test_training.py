"""The one training loop (depthlib.training): the steps it takes, what it reports, and a resumed loop's exactness."""
from __future__ import annotations

import torch

from depthlib.training import optimise

# The loop is compared with a hand-written one in the same process: both run the same kernels in the same order,
# so equality is exact and no tolerance is needed (float64 only to keep the problem well conditioned).


def _problem(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x, w = (torch.randn(64, 5, generator=gen, dtype=torch.float64), torch.randn(5, 1, generator=gen, dtype=torch.float64))
    model = torch.nn.Linear(5, 1, dtype=torch.float64)
    with torch.no_grad():
        model.weight.copy_(torch.randn(1, 5, generator=gen, dtype=torch.float64))
        model.bias.zero_()
    y = x @ w
    return model, (lambda step: ((model(x[step % 8 * 8:(step % 8 + 1) * 8]) - y[step % 8 * 8:(step % 8 + 1) * 8]) ** 2)
                   .mean())


def _rate(step: int) -> float:
    return 0.1 / (1 + step)


def test_optimise_takes_the_hand_written_steps_and_reports_each_interval():
    model, loss = _problem()
    ref, ref_loss = _problem()
    opt = torch.optim.AdamW(model.parameters(), lr=1.0, weight_decay=0.0)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1.0, weight_decay=0.0)
    seen = []
    intervals = list(optimise(model, opt, first=0, last=12, rate=_rate, loss=loss, grad_clip=0.5, evals={4, 12},
                              on_step=lambda done, value: seen.append((done, value))))
    losses = []
    for step in range(12):
        for group in ref_opt.param_groups:
            group["lr"] = _rate(step)
        value = ref_loss(step)
        value.backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        losses.append(float(value.detach()))
    assert torch.equal(model.weight, ref.weight) and torch.equal(model.bias, ref.bias)
    assert [(i.step, i.lr) for i in intervals] == [(4, _rate(3)), (12, _rate(11))]
    assert intervals[0].train_loss == sum(losses[:4]) / 4 and intervals[1].train_loss == sum(losses[4:]) / 8
    assert seen == list(zip(range(1, 13), losses))


def test_breaking_at_an_evaluation_and_resuming_there_equals_one_loop():
    whole, loss = _problem()
    opt = torch.optim.AdamW(whole.parameters(), lr=1.0)
    list(optimise(whole, opt, first=0, last=10, rate=_rate, loss=loss, grad_clip=1.0, evals={5, 10}))
    part, part_loss = _problem()
    part_opt = torch.optim.AdamW(part.parameters(), lr=1.0)
    for interval in optimise(part, part_opt, first=0, last=10, rate=_rate, loss=part_loss, grad_clip=1.0,
                             evals={5, 10}):
        break                                             # stopped after step 5's evaluation, as a checkpoint is
    assert interval.step == 5 and not torch.equal(part.weight, whole.weight)
    list(optimise(part, part_opt, first=5, last=10, rate=_rate, loss=part_loss, grad_clip=1.0, evals={10}))
    assert torch.equal(part.weight, whole.weight) and torch.equal(part.bias, whole.bias)

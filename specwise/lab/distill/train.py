"""Training a head drafter on cached target features (see :mod:`specwise.lab.distill.data`).

The loss compares q (the head's distribution over the draft vocabulary, after each unrolled drafting step) with
p (the target's, recomputed from its stored features: ``log p = lm_head(feature) - lse``):

- ``kl``: forward KL(p || q), i.e. cross-entropy -sum p log q (the mass of p outside the draft vocabulary is a
  constant);
- ``tv``: total variation 1 - sum min(p, q) = 1 - alpha, the quantity acceptance depends on;
- ``jsd``: Jensen-Shannon divergence;

plus ``feature_weight`` times a smooth-L1 loss between the predicted and the target's next feature (the head
feeds its own predictions back when drafting more than one token).

Fidelity on held-out sequences: top-1 agreement with the target's argmax over the full vocabulary (the
acceptance rate of one greedy draft) and alpha = sum min(p, q) (the acceptance rate under sampling at
temperature 1), per drafting step.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NoReturn

try:
    import torch
    import torch.nn.functional as F
except ModuleNotFoundError as err:  # torch code: the distill extra
    from specwise.extras import missing_extra

    raise missing_extra(err, "distill", "specwise distill") from err

from specwise.drafters.head import EagleHead
from specwise.files import atomic_path
from specwise.lab.distill.data import Shard
from specwise.lab.distill.losses import LOSSES

__all__ = [
    "TrainConfig",
    "TrainStateError",
    "Batch",
    "make_batches",
    "head_loss",
    "evaluate",
    "train_head",
    "draft_vocabulary",
    "token_counts",
    "LOSSES",
]

STATE_KEYS = ("head", "optimizer", "step", "history", "before", "torch_rng")
ADAM_STATE = ("step", "exp_avg", "exp_avg_sq")
RESTART = "delete it and train again without --resume (or choose another --out)"


class TrainStateError(ValueError):
    """A training checkpoint (``train_state.pt``) that cannot be resumed safely."""


@dataclass
class TrainConfig:
    loss: str = "kl"
    steps_unrolled: int = 3  # drafting steps simulated in training (training-time test)
    step_decay: float = 0.8  # weight of step s is decay ** (s - 1)
    feature_weight: float = 0.1
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup: int = 50
    epochs: float = 2.0
    batch_tokens: int = 1024
    max_seq_len: int = 384
    grad_clip: float = 1.0
    seed: int = 0
    checkpoint_every_s: float = 300.0
    eval_every: int = 200

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise ValueError(f"unknown loss {self.loss!r}: use one of {', '.join(LOSSES)}")
        if self.steps_unrolled < 1:
            raise ValueError(f"steps_unrolled must be >= 1, got {self.steps_unrolled}")


@dataclass
class Batch:
    features: torch.Tensor  # [B, T, d] float32
    tokens: torch.Tensor  # [B, T] int64 (the token at each position)
    lse: torch.Tensor  # [B, T] float32
    lengths: torch.Tensor  # [B]
    answer_starts: torch.Tensor  # [B] first position in the answer (0 for text without a prompt)


def token_counts(shards: list[Shard], vocab_size: int) -> torch.Tensor:
    """How often each token id occurs in the shards: ``[vocab_size]`` int64."""
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for shard in shards:
        counts += torch.bincount(shard.tokens.long(), minlength=vocab_size)
    return counts


def draft_vocabulary(shards: list[Shard], size: int, always: set[int], vocab_size: int) -> torch.Tensor:
    """The ``size`` most frequent tokens of the data (plus ``always``, e.g. EOS), sorted ids."""
    counts = token_counts(shards, vocab_size)
    for t in always:
        counts[t] = counts.max() + 1
    size = min(size, vocab_size)
    return torch.sort(torch.topk(counts, size).indices).values


def _sequences(shards: list[Shard], max_len: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    out = []
    for shard in shards:
        for tokens, feats, lse, prompt_len in shard.sequences():
            for a in range(0, len(tokens), max_len):
                if len(tokens) - a >= 3:  # at least one position with a next feature and token
                    piece = (tokens[a : a + max_len], feats[a : a + max_len], lse[a : a + max_len])
                    out.append((*piece, max(prompt_len - a, 0)))
    return out


def make_batches(shards: list[Shard], batch_tokens: int, max_len: int, seed: int) -> list[Batch]:
    """Sequences grouped by length into padded batches of about ``batch_tokens`` tokens, in a seeded order."""
    seqs = sorted(_sequences(shards, max_len), key=lambda s: len(s[0]))
    batches, group = [], []
    for seq in seqs:
        if group and (len(group) + 1) * len(seq[0]) > batch_tokens:
            batches.append(_collate(group))
            group = []
        group.append(seq)
    if group:
        batches.append(_collate(group))
    random.Random(seed).shuffle(batches)
    return batches


def _collate(group) -> Batch:
    T = max(len(s[0]) for s in group)
    d = group[0][1].shape[-1]
    feats = torch.zeros(len(group), T, d, dtype=torch.float16)
    tokens = torch.zeros(len(group), T, dtype=torch.int64)
    lse = torch.zeros(len(group), T)
    for i, (t, f, norm, _) in enumerate(group):
        n = len(t)
        tokens[i, :n], feats[i, :n], lse[i, :n] = t.long(), f, norm
    lengths = torch.tensor([len(s[0]) for s in group])
    return Batch(feats, tokens, lse, lengths, torch.tensor([s[3] for s in group]))


def _on(batch: Batch, device: torch.device) -> Batch:
    """The batch's tensors on ``device`` (batches stay on the CPU; the head may train on a GPU)."""
    if batch.tokens.device == device:
        return batch
    parts = (batch.features, batch.tokens, batch.lse, batch.lengths, batch.answer_starts)
    return Batch(*(x.to(device, non_blocking=True) for x in parts))


def _step_terms(head: EagleHead, batch: Batch, steps: int):
    """Run the unrolled head; yield per step (valid mask [B, T-1], log q, log p, predicted and true features)."""
    batch = _on(batch, head.vocab_ids.device)
    feats = batch.features.float()
    nxt = torch.cat([batch.tokens[:, 1:], torch.zeros_like(batch.tokens[:, :1])], dim=1)
    preds = head(feats, nxt, steps)
    target_feat = feats[:, 1:]  # position t predicts the feature at t + 1
    with torch.no_grad():
        log_p = head.logits(target_feat) - batch.lse[:, 1:, None]  # [B, T-1, Vd]; sums to <= 1 over Vd
    t = torch.arange(feats.shape[1] - 1, device=feats.device)
    for s, pred in enumerate(preds, start=1):
        valid = (t[None, :] >= s - 1) & (t[None, :] < batch.lengths[:, None] - 1)
        log_q = torch.log_softmax(head.logits(pred[:, :-1]), dim=-1)
        yield s, valid, log_q, log_p, pred[:, :-1], target_feat


def _token_loss(kind: str, log_q: torch.Tensor, log_p: torch.Tensor) -> torch.Tensor:
    """Per position loss [..] between q and p over the draft vocabulary."""
    p = log_p.exp()
    if kind == "kl":
        return -(p * log_q).sum(-1)
    q = log_q.exp()
    if kind == "tv":
        return 1.0 - torch.minimum(p, q).sum(-1)
    m = 0.5 * (p + q)
    log_m = torch.log(m.clamp_min(1e-20))
    return 0.5 * (p * (log_p - log_m)).sum(-1) + 0.5 * (q * (log_q - log_m)).sum(-1)


def head_loss(head: EagleHead, batch: Batch, cfg: TrainConfig) -> tuple[torch.Tensor, dict]:
    total = 0.0
    logs = {}
    for s, valid, log_q, log_p, pred, target in _step_terms(head, batch, cfg.steps_unrolled):
        w = cfg.step_decay ** (s - 1)
        n = valid.sum().clamp_min(1)
        tok = (_token_loss(cfg.loss, log_q, log_p) * valid).sum() / n
        feat = (F.smooth_l1_loss(pred, target, reduction="none").mean(-1) * valid).sum() / n
        total = total + w * (tok + cfg.feature_weight * feat)
        logs[f"loss_{s}"] = float(tok.detach())
    return total, logs


@torch.no_grad()
def evaluate(head: EagleHead, batches: list[Batch], steps: int, full_head: torch.Tensor) -> dict:
    """Top-1 agreement and alpha per drafting step on held-out batches, at the answers' positions (where drafting
    happens; the prompts' chat template is easy to predict and would flatter the figures).

    full_head: the target's output layer [vocab, d], for the target's argmax over the whole vocabulary.
    """
    agree = [0.0] * steps
    alpha = [0.0] * steps
    count = [0] * steps
    for batch in batches:
        batch = _on(batch, head.vocab_ids.device)
        t = torch.arange(batch.tokens.shape[1] - 1, device=batch.tokens.device)
        in_answer = t[None, :] + 1 >= batch.answer_starts[:, None]  # [B, T-1]: position t predicts an answer token
        target_top = None
        for s, valid, log_q, log_p, _, target in _step_terms(head, batch, steps):
            valid = valid & in_answer
            if target_top is None:  # the target's argmax over the full vocabulary, in chunks of rows
                flat = target.reshape(-1, target.shape[-1])
                target_top = torch.cat([(c @ full_head.T).argmax(-1) for c in flat.split(512)]).view(valid.shape)
            draft_top = head.vocab_ids[log_q.argmax(-1)]
            agree[s - 1] += float(((target_top == draft_top) & valid).sum())
            alpha[s - 1] += float((torch.minimum(log_p.exp(), log_q.exp()).sum(-1) * valid).sum())
            count[s - 1] += int(valid.sum())
    return {
        "positions": count[0],
        "top1_agreement": [round(a / max(c, 1), 4) for a, c in zip(agree, count)],
        "alpha": [round(a / max(c, 1), 4) for a, c in zip(alpha, count)],
    }


def _save_state(path: Path, head: EagleHead, opt, step: int, history: list, before: dict | None) -> None:
    state = {
        "head": head.state_dict(),
        "optimizer": opt.state_dict(),
        "step": step,
        "history": history,
        "before": before,
        "torch_rng": torch.get_rng_state(),
    }
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def _refuse(path: Path, what: str) -> NoReturn:
    raise TrainStateError(f"{path}: {what}: {RESTART}")


def _plain(value, depth: int = 0) -> bool:
    """Whether ``value`` is JSON-like (numbers, strings, None, and lists and dicts of them, a few levels deep):
    what a checkpoint's history and held-out figures hold."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if depth >= 4:
        return False
    if isinstance(value, list):
        return all(_plain(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v, depth + 1) for k, v in value.items())
    return False


def _check_tensors(path: Path, what: str, saved, expected: dict[str, torch.Tensor]) -> None:
    """``saved`` a dict of finite tensors with ``expected``'s names, shapes and kinds (floating or not)."""
    if not isinstance(saved, dict) or set(saved) != set(expected):
        _refuse(path, f"{what} does not hold the tensors {', '.join(sorted(expected))}")
    for name, want in expected.items():
        got = saved[name]
        if not torch.is_tensor(got) or got.shape != want.shape or got.is_floating_point() != want.is_floating_point():
            _refuse(path, f"{what}[{name!r}] is not a tensor of shape {list(want.shape)}")
        if got.is_floating_point() and not bool(torch.isfinite(got).all()):
            _refuse(path, f"{what}[{name!r}] holds NaN or infinite values")


def _check_optimizer(path: Path, saved, params: list[torch.Tensor]) -> None:
    """An AdamW state for ``params``: one parameter group over all of them, and per parameter its step and moments
    (shaped like the parameter)."""
    if not isinstance(saved, dict) or set(saved) != {"state", "param_groups"}:
        _refuse(path, "optimizer is not an optimizer's state (state, param_groups)")
    groups, states = saved["param_groups"], saved["state"]
    if not isinstance(groups, list) or len(groups) != 1 or not isinstance(groups[0], dict):
        _refuse(path, "optimizer does not hold one parameter group")
    if groups[0].get("params") != list(range(len(params))):
        _refuse(path, f"optimizer's parameter group is not over the head's {len(params)} parameters")
    if not _plain({k: list(v) if isinstance(v, tuple) else v for k, v in groups[0].items()}):
        _refuse(path, "optimizer's parameter group holds values other than numbers")
    if not isinstance(states, dict) or not set(states) <= set(range(len(params))):
        _refuse(path, "optimizer's state is not keyed by the head's parameters")
    for i, state in states.items():
        expected = {"step": torch.zeros(()), "exp_avg": params[i], "exp_avg_sq": params[i]}
        _check_tensors(path, f"optimizer state {i}", state, expected)


def _load_state(path: Path, head: EagleHead, opt, params: list[torch.Tensor]) -> tuple[int, list, dict | None]:
    """Read a checkpoint written by :func:`_save_state` into ``head`` and ``opt`` (and the RNG); returns (step,
    history, before). The file is untrusted: it is unpickled with ``weights_only`` (tensors, numbers, strings and
    containers only: a planted object is refused, never built), and every entry is checked before use."""
    import pickle

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        _refuse(path, "it holds Python objects other than tensors and numbers (refused: loading it could run code)")
    except Exception as e:  # any malformed file: a zip, a pickle or a tensor record that does not parse
        _refuse(path, f"not a readable training state ({type(e).__name__})")
    if not isinstance(state, dict) or set(state) != set(STATE_KEYS):
        _refuse(path, f"not a training state (expected the entries {', '.join(STATE_KEYS)})")
    _check_tensors(path, "head", state["head"], head.state_dict())
    for name, buffer in head.named_buffers():  # the draft vocabulary and rotary table are the head's, not trained
        if not torch.equal(state["head"][name], buffer.cpu()):
            _refuse(path, f"head[{name!r}] differs from the head's in config.json's directory")
    _check_optimizer(path, state["optimizer"], params)
    step, history, before = state["step"], state["history"], state["before"]
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        _refuse(path, f"step is {step!r}, expected an integer >= 0")
    if not isinstance(history, list) or not _plain(history):
        _refuse(path, "history is not a list of held-out figures")
    if before is not None and not (isinstance(before, dict) and _plain(before)):
        _refuse(path, "before is not the held-out figures before training")
    rng = state["torch_rng"]
    if not torch.is_tensor(rng) or rng.dtype != torch.uint8 or rng.shape != torch.get_rng_state().shape:
        _refuse(path, "torch_rng is not the state of torch's CPU generator")
    head.load_state_dict(state["head"])
    opt.load_state_dict(state["optimizer"])
    torch.set_rng_state(rng)
    return step, history, before


def train_head(
    head: EagleHead,
    train: list[Batch],
    held_out: list[Batch],
    full_head: torch.Tensor,
    cfg: TrainConfig,
    state_path: Path,
    resume: bool = False,
    progress: bool = True,
    log=print,
    max_steps: int | None = None,
) -> dict:
    """Train ``head`` in place; checkpoint to ``state_path`` atomically; return a report with held-out fidelity.

    max_steps: stop (with a checkpoint) after this many steps, before the schedule's end; ``resume`` continues.
    """
    from tqdm import tqdm

    torch.manual_seed(cfg.seed)
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    total_steps = max(1, int(cfg.epochs * len(train)))
    step, history, before = 0, [], None
    if resume and state_path.exists():
        step, history, before = _load_state(state_path, head, opt, params)
        log(f"resumed from {state_path} at step {step}/{total_steps}")

    def lr_at(i: int) -> float:
        if i < cfg.warmup:
            return cfg.lr * (i + 1) / cfg.warmup
        frac = (i - cfg.warmup) / max(1, total_steps - cfg.warmup)
        return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))

    if step == 0:
        before = evaluate(head, held_out, cfg.steps_unrolled, full_head)
    last_ckpt = time.monotonic()
    bar = tqdm(total=total_steps, initial=step, desc="training head", unit="step", disable=not progress)
    bar.set_postfix_str("")
    head.train()
    stop_at = total_steps if max_steps is None else min(max_steps, total_steps)
    while step < stop_at:
        batch = train[step % len(train)]
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        loss, logs = head_loss(head, batch, cfg)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{float(loss.detach()):.3f}")
        if step % cfg.eval_every == 0 or step == total_steps:
            head.eval()
            ev = evaluate(head, held_out, cfg.steps_unrolled, full_head)
            head.train()
            history.append({"step": step, "loss": float(loss.detach()), **ev})
            log(f"step {step}: held-out top-1 {ev['top1_agreement']}, alpha {ev['alpha']}")
        if time.monotonic() - last_ckpt > cfg.checkpoint_every_s or step == stop_at:
            _save_state(state_path, head, opt, step, history, before)
            last_ckpt = time.monotonic()
    bar.close()
    head.eval()
    after = evaluate(head, held_out, cfg.steps_unrolled, full_head)
    return {"config": asdict(cfg), "steps": step, "before": before, "after": after, "history": history}

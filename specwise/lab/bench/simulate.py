"""The theory, drawn for readers (``specwise simulate``).

- E[τ] against α for several γ: ``(1 − α^(γ+1)) / (1 − α)`` (:func:`specwise.metrics.expected_tau`).
- Speedup against the drafter's cost ``c`` (one draft token's time ÷ one target pass's), for the i.i.d. model of
  Leviathan et al.: a step costs ``γc + 1`` target passes and yields E[τ] tokens, so speedup = E[τ] / (γc + 1).
- Exactness made visible: on two small table-driven models (:class:`specwise.models.toy.ToyModel`), the
  distribution of sequences emitted by speculative sampling against the target's exact distribution p and the
  draft's q, computed by enumeration.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specwise.drafters.model import ModelDrafter
from specwise.engine import Engine
from specwise.extras import missing_extra
from specwise.metrics import SpecStats, expected_tau
from specwise.models.toy import ToyModel
from specwise.sampling import SamplingParams, make_generator, probs_from_logits

__all__ = ["SIMULATE_FILES", "SimulateSettings", "exactness_experiment", "run_simulate", "speedup", "summary_lines"]

SIMULATE_FILES = {
    "tau": "tau_vs_alpha.png",
    "cost": "speedup_vs_cost.png",
    "exactness": "exactness.png",
    "json": "simulate.json",
}


@dataclass
class SimulateSettings:
    """What to draw. ``gamma`` is used for the speedup curves and the exactness experiment."""

    gammas: tuple[int, ...] = (1, 2, 3, 4, 6, 8)
    gamma: int = 4
    alphas: tuple[float, ...] = (0.5, 0.7, 0.8, 0.9)
    samples: int = 10000
    vocab: int = 3
    length: int = 3
    temperature: float = 1.0
    seed: int = 0

    def check(self) -> None:
        """Raise ValueError on settings that cannot run."""
        if not self.gammas or min(self.gammas) < 1 or self.gamma < 1:
            raise ValueError(f"gammas must be integers >= 1, got {list(self.gammas)} and {self.gamma}")
        if not self.alphas or not all(0.0 <= a < 1.0 for a in self.alphas):
            raise ValueError(f"alphas must be in [0, 1), got {list(self.alphas)}")
        if self.samples < 1:
            raise ValueError(f"samples must be >= 1, got {self.samples}")
        if not 2 <= self.vocab <= 8 or not 2 <= self.length <= 4:
            raise ValueError(
                f"the toy experiment needs 2 <= vocab <= 8 and 2 <= length <= 4, got {self.vocab}, {self.length}"
            )
        if self.temperature <= 0:
            raise ValueError(f"the exactness experiment samples: temperature must be > 0, got {self.temperature}")


def speedup(alpha: float, gamma: int, cost: float) -> float:
    """Expected speedup over plain decoding: E[τ] / (γ·cost + 1), cost = draft token time ÷ target pass time."""
    return expected_tau(alpha, gamma) / (gamma * cost + 1.0)


def tau_curves(gammas: tuple[int, ...], points: int = 100) -> dict:
    alphas = [i / points for i in range(points)]
    return {"alpha": alphas, "tau": {str(g): [expected_tau(a, g) for a in alphas] for g in gammas}}


def speedup_curves(alphas: tuple[float, ...], gamma: int, points: int = 100) -> dict:
    costs = [i / points for i in range(points + 1)]
    return {"gamma": gamma, "cost": costs, "speedup": {str(a): [speedup(a, gamma, c) for c in costs] for a in alphas}}


# ---------------------------------------------------------------------------------------------------- exactness


def exact_joint(model: ToyModel, length: int, params: SamplingParams) -> np.ndarray:
    """Probability ``[vocab ** length]`` of every continuation of the prompt ``[0]``, in lexicographic order."""
    cond = probs_from_logits(model.table, params)  # [periods, vocab, vocab]: next token given position, token
    periods, vocab = cond.shape[0], cond.shape[-1]
    probs = []
    for seq in itertools.product(range(vocab), repeat=length):
        p, prev = 1.0, 0
        for position, token in enumerate(seq):
            p *= float(cond[position % periods, prev, token])
            prev = token
        probs.append(p)
    return np.asarray(probs, dtype=np.float64)


def _index(tokens: list[int], vocab: int) -> int:
    index = 0
    for t in tokens:
        index = index * vocab + t
    return index


def _tv(a: np.ndarray, b: np.ndarray) -> float:
    """Total variation distance between two distributions."""
    return 0.5 * float(np.abs(a - b).sum())


def exactness_experiment(s: SimulateSettings) -> dict:
    """Sample ``s.samples`` continuations by speculative sampling with a draft far from the target and compare."""
    target = ToyModel.random(s.vocab, seed=s.seed)
    draft = ToyModel.random(s.vocab, seed=s.seed + 1)
    params = SamplingParams(temperature=s.temperature)
    p, q = exact_joint(target, s.length, params), exact_joint(draft, s.length, params)
    gamma = min(s.gamma, s.length - 1)  # the engine drafts at most length - 1 tokens before the last one
    engine = Engine(target, ModelDrafter(draft), gamma=gamma)
    counts = np.zeros_like(p)
    stats = SpecStats()
    for i in range(s.samples):
        run_params = SamplingParams(temperature=s.temperature, seed=s.seed * 1_000_003 + i)
        result = engine.generate([0], run_params, s.length, eos_token_ids=[])
        counts[_index(result.token_ids, s.vocab)] += 1
        stats.merge(result.stats)
    emitted = counts / s.samples
    gen = make_generator(s.seed)
    iid = gen.multinomial(s.samples, p / p.sum())  # counts of an i.i.d. sample of p
    return {
        "vocab": s.vocab,
        "length": s.length,
        "gamma": gamma,
        "samples": s.samples,
        "temperature": s.temperature,
        "outcomes": [" ".join(map(str, seq)) for seq in itertools.product(range(s.vocab), repeat=s.length)],
        "p": p.tolist(),
        "q": q.tolist(),
        "emitted": emitted.tolist(),
        "tv_emitted_vs_p": _tv(emitted, p),
        "tv_iid_sample_vs_p": _tv(iid / s.samples, p),
        "tv_q_vs_p": _tv(q, p),
        "acceptance_rate": stats.acceptance_rate,
        "mean_accepted_length": stats.mean_accepted_length,
    }


# ---------------------------------------------------------------------------------------------------- plots


def _figure(width: float, height: float):
    try:
        from matplotlib.figure import Figure
    except ModuleNotFoundError as err:
        raise missing_extra(err, "bench", "specwise's plots") from err

    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, fig.add_subplot()


def _plot_tau(curves: dict, path: Path) -> None:
    fig, ax = _figure(7.0, 5.0)
    for gamma, taus in curves["tau"].items():
        ax.plot(curves["alpha"], taus, label=f"γ = {gamma}")
    limit = [1 / (1 - a) for a in curves["alpha"]]
    ax.plot(curves["alpha"], limit, color="gray", linestyle=":", label="γ → ∞: 1 / (1 − α)")
    ax.set_ylim(1, max(max(t) for t in curves["tau"].values()) + 0.5)
    ax.set_xlim(0, 1)
    ax.set_xlabel("α (probability each drafted token is accepted)")
    ax.set_ylabel("E[τ]: tokens per target pass")
    ax.set_title("E[τ] = (1 − α^(γ+1)) / (1 − α)")
    ax.legend(fontsize="small", loc="upper left")
    fig.savefig(path, dpi=120)


def _plot_cost(curves: dict, path: Path) -> None:
    fig, ax = _figure(7.0, 5.0)
    for alpha, values in curves["speedup"].items():
        ax.plot(curves["cost"], values, label=f"α = {alpha}")
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xlim(0, 1)
    ax.set_xlabel("c: one draft token's time ÷ one target pass's time")
    ax.set_ylabel("expected speedup over plain decoding (×)")
    ax.set_title(f"Speedup = E[τ] / (γc + 1), γ = {curves['gamma']}")
    ax.legend(fontsize="small")
    fig.savefig(path, dpi=120)


def _plot_exactness(exp: dict, path: Path) -> None:
    n = len(exp["outcomes"])
    fig, ax = _figure(max(8.0, 0.32 * n + 2), 4.8)
    xs = list(range(n))
    ax.bar([x - 0.2 for x in xs], exp["p"], 0.4, label="p: target, exact")
    ax.bar([x + 0.2 for x in xs], exp["emitted"], 0.4, label=f"emitted by speculative sampling ({exp['samples']} runs)")
    ax.plot(xs, exp["q"], "k_", markersize=12, label="q: draft, exact")
    ax.set_xticks(xs, exp["outcomes"], rotation=90, fontsize="small")
    ax.set_xlabel(f"continuation ({exp['length']} tokens, vocabulary {exp['vocab']})")
    ax.set_ylabel("probability")
    ax.set_title(
        f"Exactness: TV(emitted, p) = {exp['tv_emitted_vs_p']:.4f} "
        f"(i.i.d. sample of p: {exp['tv_iid_sample_vs_p']:.4f}); TV(q, p) = {exp['tv_q_vs_p']:.3f}; "
        f"γ = {exp['gamma']}, α = {exp['acceptance_rate']:.2f}",
        fontsize="medium",
    )
    ax.legend(fontsize="small")
    fig.savefig(path, dpi=120)


def run_simulate(settings: SimulateSettings, out_dir: str | Path) -> dict:
    """Compute the curves and the exactness experiment; write the plots and ``simulate.json`` into ``out_dir``."""
    settings.check()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = {
        "tau_vs_alpha": tau_curves(settings.gammas),
        "speedup_vs_cost": speedup_curves(settings.alphas, settings.gamma),
        "exactness": exactness_experiment(settings),
    }
    _plot_tau(data["tau_vs_alpha"], out / SIMULATE_FILES["tau"])
    _plot_cost(data["speedup_vs_cost"], out / SIMULATE_FILES["cost"])
    _plot_exactness(data["exactness"], out / SIMULATE_FILES["exactness"])
    (out / SIMULATE_FILES["json"]).write_text(json.dumps(data, indent=1), encoding="utf-8")
    return data


def summary_lines(data: dict) -> list[str]:
    """A few lines for the terminal."""
    exp = data["exactness"]
    taus = ", ".join(f"gamma={g}: {expected_tau(0.8, int(g)):.2f}" for g in data["tau_vs_alpha"]["tau"])
    cost = data["speedup_vs_cost"]
    speedups = ", ".join(f"alpha={a}: {speedup(float(a), cost['gamma'], 0.1):.2f}x" for a in cost["speedup"])
    return [
        f"E[tau] at alpha=0.80: {taus}",
        f"speedup at drafter cost c=0.10, gamma={cost['gamma']}: {speedups}",
        f"exactness ({exp['samples']} runs, vocabulary {exp['vocab']}, {exp['length']} tokens, gamma {exp['gamma']}, "
        f"temperature {exp['temperature']}, alpha {exp['acceptance_rate']:.2f}): "
        f"TV(emitted, p) = {exp['tv_emitted_vs_p']:.4f} (an i.i.d. sample of p: {exp['tv_iid_sample_vs_p']:.4f}); "
        f"TV(q, p) = {exp['tv_q_vs_p']:.3f}",
    ]

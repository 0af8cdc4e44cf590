"""Distillation data: the target's own answers to instruction prompts, with its features, cached to disk.

For every sequence (chat-formatted prompt followed by the target's answer) a shard stores, per token:

- ``tokens``: the token id (int32);
- ``features``: the target's last hidden state after the final norm (float16), the input of its output layer;
- ``lse``: log-sum-exp of the target's logits over the full vocabulary (float32), so that the target's
  probability of any token v is ``exp(lm_head(feature)[v] - lse)`` without storing ``[vocab]`` per token.

Answers are generated in batches (left-padded, the batch's rows share each forward pass), which is several
times faster than one sequence at a time on a CPU. Shards are written atomically and the run resumes where it
stopped: a prompt whose shard exists is not generated again. The prompts, their files and the data directory's plan
are :mod:`specwise.lab.answers`' (shared with ``specwise index``).
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np

try:
    import torch
except ModuleNotFoundError as err:  # torch code: the distill extra
    from specwise.extras import missing_extra

    raise missing_extra(err, "distill", "specwise distill") from err

from specwise.files import atomic_path, write_json_atomic
from specwise.lab.answers import answer_seed, check_plan, request_cache, request_seed, user_turn_prefix

__all__ = ["Shard", "generate_shards", "load_shards", "self_prompts", "corpus_shards"]


@dataclass
class Shard:
    """Sequences of one batch: flat per-token arrays and each sequence's [start, end) and prompt length."""

    tokens: torch.Tensor  # [n] int32
    features: torch.Tensor  # [n, hidden] float16
    lse: torch.Tensor  # [n] float32
    offsets: torch.Tensor  # [num_seqs + 1] int64
    prompt_lengths: torch.Tensor  # [num_seqs] int64

    def sequences(self):
        """Yield (tokens, features, lse, prompt_length) per sequence."""
        for i in range(len(self.prompt_lengths)):
            a, b = int(self.offsets[i]), int(self.offsets[i + 1])
            yield self.tokens[a:b], self.features[a:b], self.lse[a:b], int(self.prompt_lengths[i])


def _save_atomic(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None) -> None:
    from safetensors.torch import save_file

    with atomic_path(path) as tmp:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata=metadata)


def _logsumexp(hf_model, hidden: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """log-sum-exp of the output layer's logits for ``hidden`` [n, d], in chunks of rows (the logits are large)."""
    head = hf_model.get_output_embeddings()
    out = []
    for i in range(0, hidden.shape[0], chunk):
        out.append(torch.logsumexp(head(hidden[i : i + chunk]).float(), dim=-1))
    return torch.cat(out) if out else hidden.new_empty(0)


@torch.inference_mode()
def _generate_batch(
    hf_model,
    prompts: list[list[int]],
    max_new_tokens: int,
    eos: set[int],
    pad_id: int,
    temperature: float,
    generator: torch.Generator,
) -> list[tuple[list[int], torch.Tensor, torch.Tensor]]:
    """Generate answers for a batch of token-id prompts (left-padded); return (tokens, features, lse) per row.

    features/lse cover every token of the sequence except the last (whose features nothing needs).
    """
    from transformers import DynamicCache

    from specwise.models.hf import cache_keyword

    device = next(hf_model.parameters()).device
    batch = len(prompts)
    width = max(len(p) for p in prompts)
    ids = torch.full((batch, width), pad_id, dtype=torch.int64)
    mask = torch.zeros((batch, width), dtype=torch.int64)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    ids, mask = ids.to(device), mask.to(device)
    cache = DynamicCache(config=hf_model.config)
    base = hf_model.model
    head = hf_model.get_output_embeddings()
    feats: list[torch.Tensor] = []  # [batch, t, d] pieces
    lses: list[torch.Tensor] = []
    tokens = ids
    step_ids = ids
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    lengths = torch.full((batch,), max_new_tokens, dtype=torch.int64)
    eos_t = torch.tensor(sorted(eos), device=device)
    cache_kw = cache_keyword(base)
    for step in range(max_new_tokens):
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, -step_ids.shape[1] :]
        hidden = base(
            input_ids=step_ids, attention_mask=mask, position_ids=positions, use_cache=True, **{cache_kw: cache}
        ).last_hidden_state  # [batch, t, d], after the final norm
        feats.append(hidden.to(torch.float16))
        flat = hidden.reshape(-1, hidden.shape[-1])
        lses.append(_logsumexp(hf_model, flat).view(batch, -1))
        logits = head(hidden[:, -1]).float()  # [batch, vocab]
        if temperature == 0:
            nxt = logits.argmax(-1)
        else:
            probs = torch.softmax(logits / temperature, dim=-1)
            # drawn on the CPU (the seeded generator is a CPU one): the same answers on any device
            nxt = torch.multinomial(probs.cpu(), 1, generator=generator)[:, 0].to(device)
        nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)
        finished_now = torch.isin(nxt, eos_t) & ~done
        lengths[finished_now.cpu()] = step + 1
        done |= finished_now
        tokens = torch.cat([tokens, nxt[:, None]], dim=1)
        mask = torch.cat([mask, (~done | finished_now).long()[:, None]], dim=1)
        step_ids = nxt[:, None]
        if bool(done.all()):
            break
    all_feats = torch.cat(feats, dim=1)  # [batch, width + steps - 1, d]
    all_lse = torch.cat(lses, dim=1)
    out = []
    for i, p in enumerate(prompts):
        a = width - len(p)
        b = width + int(lengths[i])  # end of the row's tokens (answer included)
        b = min(b, tokens.shape[1])
        row_tokens = tokens[i, a:b].tolist()
        out.append((row_tokens, all_feats[i, a : b - 1].cpu(), all_lse[i, a : b - 1].cpu()))
    return out


@torch.inference_mode()
def _generate_batch_native(
    model, prompts: list[list[int]], max_new_tokens: int, eos: set[int], temperature: float, generator: torch.Generator
) -> list[tuple[list[int], torch.Tensor, torch.Tensor]]:
    """``_generate_batch`` on the native quantized model (a ``QuantizedModel``): each prompt is a sequence of its
    own (``model.sequence()``, features kept) fed alone, then each step is one pass over the unfinished rows
    (``forward_batch``: every weight read once for all of them). The same (tokens, features, lse) per row, as the
    native model evaluates the target, which is what a head is given when it drafts for that target. The model
    takes and returns numpy arrays (the Model contract); the rows are tensors, as ``_generate_batch``'s."""
    seqs, tokens, lses, last = [], [], [], []
    for prompt in prompts:
        seq = model.sequence()
        seq.set_keep_features(True)
        logits = _tensor(seq.forward(np.asarray(prompt, dtype=np.int64)))  # [len, vocab]
        seqs.append(seq)
        tokens.append(list(prompt))
        lses.append([torch.logsumexp(logits, -1)])
        last.append(logits[-1])
    active = list(range(len(prompts)))
    for step in range(max_new_tokens):
        logits = torch.stack([last[i] for i in active])  # [rows, vocab]
        if temperature == 0:
            chosen = logits.argmax(-1)
        else:
            chosen = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=generator)[:, 0]
        fed = []
        for i, token in zip(active, chosen.tolist()):
            tokens[i].append(token)
            if token not in eos:
                fed.append(i)
        if not fed or step + 1 == max_new_tokens:
            break  # the last token of every row is not fed: nothing needs its features
        outs = model.forward_batch([(seqs[i], [tokens[i][-1]]) for i in fed], [1] * len(fed))
        for i, out in zip(fed, map(_tensor, outs)):
            lses[i].append(torch.logsumexp(out, -1))
            last[i] = out[-1]
        active = fed
    rows = []
    for seq, row, lse in zip(seqs, tokens, lses):
        n = len(row) - 1
        rows.append((row, _tensor(seq.features(0, n)).to(torch.float16), torch.cat(lse)[:n].float()))
    return rows


def _tensor(values: np.ndarray) -> torch.Tensor:
    """A model's float32 numpy output (logits, features) as a tensor: shared, or copied where it is read-only."""
    values = np.asarray(values, dtype=np.float32)
    return torch.from_numpy(values if values.flags.writeable else values.copy())


def generate_shards(
    loaded,
    prompts: list[str],
    out_dir: Path,
    batch_size: int = 64,
    max_prompt_tokens: int = 256,
    max_new_tokens: int = 192,
    temperatures: tuple[float, ...] = (0.0,),
    seed: int = 0,
    progress: bool = True,
    max_batches: int | None = None,
    native=None,
) -> list[Path]:
    """Have the target answer ``prompts`` and store shards in ``out_dir`` (resumable). Returns the shard paths.

    native: the target as the native quantized model evaluates it (a ``QuantizedModel``, ``q8``) to write the
    answers with instead of the float32 reference (``loaded.hf_model``); the plan records it.

    Prompts are grouped in blocks of 8 batches, sorted by length inside a block so that a batch pads little.
    Batch j is generated at ``temperatures[j % len(temperatures)]`` (0 is greedy). ``max_batches`` generates
    only the first batches of the same plan, so a later, larger run extends the same directory. A manifest
    records the plan; a directory made with another plan is refused.
    """
    from tqdm import tqdm

    from specwise.runtime import encode_prompt, eos_ids

    out_dir.mkdir(parents=True, exist_ok=True)
    tok = loaded.tokenizer
    encoded = [encode_prompt(tok, p, chat=True) for p in prompts]
    encoded = [e for e in encoded if len(e) <= max_prompt_tokens]
    batches: list[list[list[int]]] = []
    block = 8 * batch_size
    for i in range(0, len(encoded), block):
        chunk = sorted(encoded[i : i + block], key=len)
        batches.extend(chunk[j : j + batch_size] for j in range(0, len(chunk), batch_size))
    check_plan(
        out_dir,
        {
            "target": loaded.name,
            "prompts_sha256": hashlib.sha256(json.dumps(encoded).encode()).hexdigest(),
            "batch_size": batch_size,
            "max_prompt_tokens": max_prompt_tokens,
            "max_new_tokens": max_new_tokens,
            "temperatures": list(temperatures),
            "seed": seed,
            **({"evaluation": native.precision} if native is not None else {}),
        },
    )
    if max_batches is not None:
        batches = batches[:max_batches]
    eos = eos_ids(loaded) or set()
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else next(iter(eos))
    paths = []
    bar = tqdm(total=len(batches), desc="generating answers", unit="batch", disable=not progress)
    for j, batch in enumerate(batches):
        path = out_dir / f"shard_{j:05d}.safetensors"
        paths.append(path)
        if path.exists():
            bar.update(1)
            continue
        temperature = temperatures[j % len(temperatures)]
        generator = torch.Generator().manual_seed(answer_seed(seed, j))
        if native is not None:
            rows = _generate_batch_native(native, batch, max_new_tokens, eos, temperature, generator)
        else:
            rows = _generate_batch(loaded.hf_model, batch, max_new_tokens, eos, pad_id, temperature, generator)
        shard = _pack(rows, [len(p) for p in batch])
        meta = {"temperature": str(temperature), "source": "answers"}
        _save_atomic(_shard_tensors(shard), path, meta)
        bar.update(1)
        bar.set_postfix(tokens=int(shard.offsets[-1]))
    bar.close()
    return paths


def _pack(rows: list[tuple[list[int], torch.Tensor, torch.Tensor]], prompt_lengths: list[int]) -> Shard:
    """Concatenate sequences. Each keeps the tokens that have features (all but its last token)."""
    toks = [torch.tensor(r[0][: len(r[1])], dtype=torch.int32) for r in rows]
    offsets = [0]
    for t in toks:
        offsets.append(offsets[-1] + len(t))
    return Shard(
        tokens=torch.cat(toks),
        features=torch.cat([r[1] for r in rows]),
        lse=torch.cat([r[2] for r in rows]).float(),
        offsets=torch.tensor(offsets, dtype=torch.int64),
        prompt_lengths=torch.tensor(prompt_lengths, dtype=torch.int64),
    )


def _shard_tensors(shard: Shard) -> dict[str, torch.Tensor]:
    return {
        "tokens": shard.tokens,
        "features": shard.features,
        "lse": shard.lse,
        "offsets": shard.offsets,
        "prompt_lengths": shard.prompt_lengths,
    }


def corpus_pieces(tokenizer, paths: list[Path], seq_len: int, count: int, seed: int) -> list[list[int]]:
    """``count`` pieces of ``seq_len`` tokens drawn at random (seeded) from the text files, in file order.

    Every file is cut into consecutive pieces; the pieces are sampled without replacement across all files,
    so a long book does not crowd out the others more than its length warrants.
    """
    pieces: list[list[int]] = []
    for path in paths:
        ids = tokenizer(path.read_text(encoding="utf-8", errors="replace"), add_special_tokens=False)["input_ids"]
        pieces.extend(ids[i : i + seq_len] for i in range(0, len(ids) - seq_len + 1, seq_len))
    if count < len(pieces):
        chosen = sorted(random.Random(seed).sample(range(len(pieces)), count))
        pieces = [pieces[i] for i in chosen]
    return pieces


def self_prompts(
    loaded,
    count: int,
    out_dir: Path,
    seed: int,
    batch_size: int = 64,
    max_tokens: int = 96,
    min_tokens: int = 6,
    progress: bool = True,
) -> list[str]:
    """``count`` user requests written by the target itself, cached in ``out_dir/prompts.json``.

    The target's chat template is opened up to the start of a user turn and the target samples the user's
    message at temperature 1 until it ends the turn (the prompt-synthesis idea of Magpie: an instruction-tuned
    model reproduces the kind of requests it was tuned on). Messages that do not end within ``max_tokens``,
    are shorter than ``min_tokens`` or repeat an earlier one are dropped; batches continue until ``count`` are
    kept. The list is written atomically after every batch, so an interrupted run continues where it stopped.
    """
    from tqdm import tqdm

    from specwise.runtime import eos_ids

    tok = loaded.tokenizer
    prefix = user_turn_prefix(tok)
    path = out_dir / "prompts.json"
    state = request_cache(path, prefix, seed, "batches")
    kept: list[str] = state["prompts"]
    if len(kept) >= count:
        return kept[:count]
    out_dir.mkdir(parents=True, exist_ok=True)
    hf = loaded.hf_model
    device = next(hf.parameters()).device
    stop = eos_ids(loaded) or set()
    seen = set(kept)
    bar = tqdm(total=count, initial=len(kept), desc="writing prompts", unit="prompt", disable=not progress)
    while len(kept) < count:
        generator = torch.Generator().manual_seed(request_seed(seed, state["batches"]))
        rows = _sample_rows(hf, prefix, batch_size, max_tokens, stop, generator, device)
        state["batches"] += 1
        for row in rows:
            if row is None or len(row) < min_tokens:
                continue
            text = tok.decode(row, skip_special_tokens=True).strip()
            if text and text not in seen and len(kept) < count:
                seen.add(text)
                kept.append(text)
                bar.update(1)
        write_json_atomic(path, state)
        if state["batches"] > 4 * count // batch_size + 8:
            raise RuntimeError(f"the target wrote too few usable prompts ({len(kept)} of {count})")
    bar.close()
    return kept[:count]


@torch.inference_mode()
def _sample_rows(hf_model, prefix: list[int], batch: int, max_tokens: int, stop: set[int], generator, device):
    """``batch`` continuations of ``prefix`` sampled at temperature 1: token lists ending before a stop token,
    or None for rows that did not stop within ``max_tokens``."""
    from transformers import DynamicCache

    from specwise.models.hf import cache_keyword

    base = hf_model.model
    head = hf_model.get_output_embeddings()
    cache = DynamicCache(config=hf_model.config)
    step_ids = torch.tensor([prefix] * batch, device=device)
    rows: list[list[int]] = [[] for _ in range(batch)]
    done = [False] * batch
    ended = [False] * batch
    for _ in range(max_tokens):
        hidden = base(input_ids=step_ids, use_cache=True, **{cache_keyword(base): cache}).last_hidden_state
        probs = torch.softmax(head(hidden[:, -1]).float(), dim=-1)
        nxt = torch.multinomial(probs.cpu(), 1, generator=generator)[:, 0]
        for i, t in enumerate(nxt.tolist()):
            if done[i]:
                continue
            if t in stop:
                done[i] = ended[i] = True
            else:
                rows[i].append(t)
        if all(done):
            break
        step_ids = nxt[:, None].to(device)
    return [r if e else None for r, e in zip(rows, ended)]


@torch.inference_mode()
def corpus_shards(
    loaded,
    paths: list[Path],
    out_dir: Path,
    max_tokens: int,
    seq_len: int = 256,
    batch_size: int = 16,
    seed: int = 0,
    progress: bool = True,
) -> list[Path]:
    """Teacher-forced target features over plain text: about ``max_tokens`` tokens in ``seq_len``-token pieces
    sampled from the files (resumable shards, with a manifest like the answers')."""
    from tqdm import tqdm

    out_dir.mkdir(parents=True, exist_ok=True)
    count = max(1, max_tokens // seq_len)
    pieces = corpus_pieces(loaded.tokenizer, paths, seq_len, count, seed)
    check_plan(
        out_dir,
        {
            "target": loaded.name,
            "files": [p.name for p in paths],
            "pieces_sha256": hashlib.sha256(json.dumps(pieces).encode()).hexdigest(),
            "seq_len": seq_len,
            "batch_size": batch_size,
        },
    )
    base = loaded.hf_model.model
    device = next(base.parameters()).device
    paths_out = []
    groups = [pieces[i : i + batch_size] for i in range(0, len(pieces), batch_size)]
    for j, group in enumerate(tqdm(groups, desc="corpus features", unit="batch", disable=not progress)):
        path = out_dir / f"corpus_{j:05d}.safetensors"
        paths_out.append(path)
        if path.exists():
            continue
        hidden = base(input_ids=torch.tensor(group, device=device)).last_hidden_state  # [b, seq, d], final norm
        rows = []
        for i in range(len(group)):
            rows.append((group[i], hidden[i, :-1].half().cpu(), _logsumexp(loaded.hf_model, hidden[i, :-1]).cpu()))
        shard = _pack(rows, [0] * len(group))
        _save_atomic(_shard_tensors(shard), path, {"source": "corpus"})
    return paths_out


class ShardFileError(ValueError):
    """A data shard that is not one ``specwise distill`` wrote."""


SHARD_DTYPES = {
    "tokens": torch.int32,
    "features": torch.float16,
    "lse": torch.float32,
    "offsets": torch.int64,
    "prompt_lengths": torch.int64,
}


def _check_shard(path: Path, t: dict[str, torch.Tensor]) -> None:
    """A shard's tensors, their dtypes and their shapes agree (the data directory is a cache, untrusted like any
    file): n tokens, features [n, hidden], lse [n], offsets rising from 0 to n, one prompt length per sequence."""

    def refuse(what: str):
        raise ShardFileError(f"{path}: {what}: delete the file (it is made again) or pass another --data-dir")

    if set(t) != set(SHARD_DTYPES):
        refuse(f"holds the tensors {sorted(t)}, expected {sorted(SHARD_DTYPES)}")
    for name, dtype in SHARD_DTYPES.items():
        if t[name].dtype != dtype or t[name].dim() != (2 if name == "features" else 1):
            refuse(f"tensor {name!r} is {t[name].dtype} {list(t[name].shape)}, expected {dtype}")
    n, offsets = t["tokens"].numel(), t["offsets"]
    if t["features"].shape[0] != n or t["lse"].numel() != n or offsets.numel() != t["prompt_lengths"].numel() + 1:
        refuse("tokens, features, lse and offsets disagree on their lengths")
    if int(offsets[0]) != 0 or int(offsets[-1]) != n or bool((offsets[1:] < offsets[:-1]).any()):
        refuse(f"offsets do not rise from 0 to the {n} tokens")


def load_shards(paths: list[Path]) -> list[Shard]:
    """Read data shards (each checked: :func:`_check_shard`)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    shards = []
    for path in paths:
        try:
            t = load_file(str(path))
        except (SafetensorError, OSError) as e:
            raise ShardFileError(f"{path}: not a readable safetensors file ({e}): delete it (it is made again)") from e
        _check_shard(path, t)
        shards.append(Shard(t["tokens"], t["features"], t["lse"], t["offsets"], t["prompt_lengths"]))
    return shards

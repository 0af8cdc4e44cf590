"""The native architectures (llama, qwen2, qwen3, phi3, gemma3) decoded straight from a GGUF file's own block formats.

The weights stay in the file's formats (re-packed at load time into the kernels' tiles, about the file's size in
memory; nothing is converted or cached on disk) and every pass runs in native code: all decoder layers in one
call (``kernels/qllama.c``), the products over quantized weights (``kernels/quant.c``), the output layer in its own
format. Two evaluations of the same weights (``precision``):

- ``exact``: float32 activations: the dequantized float32 model's numbers up to summation order (the Hugging
  Face model built from the same file is the reference);
- ``q8``: activations quantized per block of 32 to 8 bits, integer dot products, as llama.cpp evaluates GGUF files.

Speculative decoding is exact in both: a row's logits do not depend on how many rows share a pass, so a verified
draft gives the logits plain decoding would.

One file because the weights, the cache (and what a rollback leaves in it for the next pass to reuse) and the passes
that read and write them are the fields and methods of one class.
"""

from __future__ import annotations

import copy
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from specwise.models.base import Model, TokenIds, token_ids
from specwise.models.gguf_config import GEMMA3_LOCAL_BASE, GGUFConfig, checked_file, gguf_config
from specwise.models.gguf_file import GGUFError, GGUFFile
from specwise.models.kernels.layers import DecoderStack, LayerVariant, inverse_frequencies, model_struct, rotary_tables
from specwise.models.kernels.quant import (
    GGML_Q4_0,
    MAX_ROWS,
    Arena,
    QMat,
    QTensor,
    _mode_id,
    attention_bf16_supported,
    bits_per_weight,
    lazy_empty,
    q_gemm,
    repack_jobs,
    tensor_bytes,
)
from specwise.models.threads import ThreadGovernor

__all__ = ["QuantizedModel", "GGUFConfig", "gguf_config", "checked_file", "TargetWeights"]


def _unpermute_rows(n_rows: int, n_head: int) -> np.ndarray:
    """Row order that undoes the GGUF converter's permutation of Llama's Q and K weights (interleaved rotary
    pairs back to rotate-half halves, as in the Hugging Face model): Hugging Face row (h, p, i) is file row
    (h, i, p)."""
    dim = n_rows // n_head // 2
    return np.arange(n_rows).reshape(n_head, dim, 2).swapaxes(1, 2).reshape(-1)


class TargetWeights:
    """A quantized target's layers as a drafter trained on its features reads them
    (:class:`~specwise.models.base.TargetLayers`, ``hf_model`` in LoadedModel): its embedding and output layer (the
    QTensors, rows read from their blocks on demand), its architecture, shape and fingerprint."""

    def __init__(self, model: QuantizedModel) -> None:
        self.architecture = model.config.architecture
        self.hidden_size = int(model.config.hidden_size)
        self.num_layers = int(model.config.num_hidden_layers)
        self._model = model

    @property
    def embedding(self) -> QTensor:
        return self._model.embed

    @property
    def output(self) -> QTensor:
        return self._model.lm_head

    def fingerprint(self, chunks: int = 16) -> list[float]:
        """Mean absolute value of ``chunks`` equal slices of the output layer's flattened weight (``torch.chunk``'s
        slices: ceil(size / chunks) elements each, the last shorter), computed in native code without expanding the
        layer (the identity a trained head records)."""
        head = self.output
        total = head.shape[0] * head.shape[1]
        size = -(-total // chunks)
        means = []
        for c in range(chunks):
            count = min(size, total - c * size)
            if count > 0:
                means.append(round(head.abs_sum(c * size, count) / count, 6))
        return means


def _narrowed(ggml_type: int) -> bool:
    """Whether a draft model (``drafting``) re-quantizes a matrix of this type to Q4_0: stored in more than 5 bits
    per weight."""
    bits = bits_per_weight(int(ggml_type))
    return bits is not None and bits > 5.0


def _check_float_options(precision: str, kv_cache: str, attention: str) -> None:
    """The KV cache's and the attention's formats checked: float32 (the default) or their cheaper choice, ``q8``
    only (``exact`` keeps the float32 reference's numbers), the bfloat16 attention only where the CPU has it."""
    if kv_cache not in ("float32", "float16"):
        raise ValueError(f"kv_cache must be 'float32' or 'float16', got {kv_cache!r}")
    if kv_cache == "float16" and precision != "q8":
        raise ValueError("a float16 KV cache is a q8 choice: exact keeps the float32 reference's numbers")
    if attention not in ("float32", "bfloat16"):
        raise ValueError(f"attention must be 'float32' or 'bfloat16', got {attention!r}")
    if attention == "bfloat16" and precision != "q8":
        raise ValueError("a bfloat16 attention is a q8 choice: exact keeps the float32 reference's numbers")
    if attention == "bfloat16" and not attention_bf16_supported():
        raise ValueError(
            "the bfloat16 attention needs a CPU with AVX512_BF16 and the avx512 path in use (this CPU or path "
            "has not): use attention='float32' (--attention float32)"
        )


class QuantizedModel(Model):
    """A Llama-family GGUF model behind the Model contract, decoded by the quantized native kernels."""

    def __init__(
        self,
        path: str | Path,
        precision: str = "q8",
        name: str | None = None,
        capacity: int = 1024,
        huge_pages: bool = True,
        kv_cache: str = "float32",
        attention: str = "float32",
        drafting: bool = False,
        meta: GGUFFile | None = None,
        alongside: Callable[[], object] | None = None,
    ):
        """meta: the file as ``checked_file`` returned it (read again when not given).
        alongside: work to do while the weights are re-packed (the loader reads the tokenizer): the re-packing is
        one native call on another thread, which holds no Python lock; its result is kept in ``self.alongside``.
        huge_pages: keep the weights in one mapping backed by huge pages where the system allows (a pass streams
        every weight; 2 MB pages spare the page walks of 4 KB ones: 2-6% faster passes measured on the default
        model); False: ordinary allocations.
        kv_cache: ``float32`` (the default), or ``float16`` in ``q8`` only: keys and values rounded to float16 as
        they are written, as llama.cpp keeps them, which halves what attention reads (a 1-token pass after 2,048
        tokens 0.70x the time) and changes the numbers a little: the shipped suffix index and head were built on
        the float32 cache's answers and are accepted less with it (docs/QUANTIZED.md).
        attention: ``float32`` (the default), or ``bfloat16`` in ``q8`` only, on CPUs with AVX512_BF16 (refused
        elsewhere): the attention's queries, keys, probabilities and values rounded to bfloat16 and their products
        summed in float32 (VDPBF16PS), for every pass (one row or many: the same numbers either way), which reads a
        long prompt faster (one layer's attention for a 64-row slice after 4,096-8,192 positions about 0.65x the
        time) and changes the numbers a little (docs/QUANTIZED.md).
        drafting: load the model as a cheaper drafter: every matrix of the layers, and the output layer, that the
        file stores in more than 5 bits per weight (Q5_0, Q5_1, Q8_0, Q5_K, Q6_K, float) re-quantized to Q4_0.
        Lossy, and meant for draft models only: a drafter's proposals need not be exact (the target's verification
        keeps the output exact), and a small model's pass is bound by the bytes it reads (docs/QUANTIZED.md:
        Qwen2.5-Coder-0.5B-Instruct's token 19.3 -> 14.1 ms). The embedding stays as it is."""
        _mode_id(precision)
        self.huge_pages = huge_pages
        _check_float_options(precision, kv_cache, attention)
        self.kv_dtype = np.dtype(np.float16 if kv_cache == "float16" else np.float32)
        self.attention = attention
        self.drafting = drafting
        self.path = Path(path)
        meta = meta if meta is not None else checked_file(self.path)
        config = GGUFConfig(meta)
        self.config = config
        eos = meta.get("tokenizer.ggml.eos_token_id")
        self.eos_token_id = None if eos is None else int(eos)  # the file's end-of-sequence token
        self.name = name or self.path.stem
        self.precision = precision
        self.device = "cpu"
        self.dtype = np.dtype(np.float32)
        self.hidden = config.hidden_size
        self.n_heads = config.num_attention_heads
        self.n_kv = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.eps = config.rms_norm_eps
        self.max_length = config.max_position_embeddings
        self._load_weights(meta, alongside)
        self.governor = ThreadGovernor()  # shared by the sequences (passes of one model take turns)
        self.vocab_size = self.lm_head.shape[0]
        self._inv_freq = self._inverse_frequencies(meta, config.rope_theta)
        # Gemma 3's windowed layers rotate with their own base, unscaled
        self._inv_freq_local = (
            self._inverse_frequencies(meta, GEMMA3_LOCAL_BASE, False) if config.family.gemma else None
        )
        self._rotary: dict = {}  # cos, sin for positions 0 .. n - 1 (shared by the sequences)
        self._length = 0
        self._capacity = 0
        self._tokens = np.zeros(0, dtype=np.int64)  # the token at each cached position
        # positions [0, _valid) hold the keys, values and (kept) features of _tokens[:_valid], each computed after
        # the tokens before it; past _length they are what a rollback left: a pass that feeds the same tokens there
        # again takes them as they are (``forward``: the self drafter's passes are its verification's)
        self._valid = 0
        self._grow(min(capacity, self.max_length))

    # ---- weights -----------------------------------------------------------------------------------------

    def _matrix(
        self,
        meta: GGUFFile,
        name: str,
        rows: np.ndarray | None = None,
        narrow: bool = False,
        part: tuple[int, int] | None = None,
    ) -> QTensor:
        """A matrix of the file re-packed (narrow: re-quantized to Q4_0 if the file stores it wider; part: only its
        rows first .. first + count - 1, one part of a fused tensor)."""
        info = meta.tensors.get(name)
        if info is None:
            raise ValueError(f"{self.path.name}: tensor {name} is missing")
        first, out = part if part is not None else (0, info.shape[0])
        n_in = info.shape[1]
        requantize = narrow and _narrowed(info.type)
        arena = None if requantize else self._arena
        label = name if part is None else f"{name}[{first}:{first + out}]"
        tensor = QTensor(info.type, None, out, n_in, name=label, arena=arena)
        job = (tensor, meta.raw(name)[first * tensor.row_bytes : (first + out) * tensor.row_bytes], rows)
        if self._jobs is not None and not requantize:  # re-packed later, with the others, in one native call
            self._jobs.append(job)
            return tensor
        repack_jobs([job], release=True)
        return tensor.requantized_q4_0(self._arena) if requantize else tensor

    def _vector(self, meta: GGUFFile, name: str, rows: np.ndarray | None = None) -> np.ndarray:
        values = meta.floats(name).reshape(-1)
        if rows is not None:
            values = values[rows]
        return np.ascontiguousarray(values, dtype=np.float32)

    def _layer_matrices(self, meta: GGUFFile, i: int, q_rows, k_rows) -> list[QTensor]:
        """Layer i's seven matrices q, k, v, o, gate, up, down (the parts of Phi-3's fused tensors)."""
        c, p, d = self.config, f"blk.{i}.", self.drafting
        if c.family.fused:
            qkv, gate_up = p + "attn_qkv.weight", p + "ffn_up.weight"
            return [
                *(self._matrix(meta, qkv, narrow=d, part=part) for part in c.row_parts(qkv, 0)),
                self._matrix(meta, p + "attn_output.weight", narrow=d),
                *(self._matrix(meta, gate_up, narrow=d, part=part) for part in c.row_parts(gate_up, 0)),
                self._matrix(meta, p + "ffn_down.weight", narrow=d),
            ]
        return [
            self._matrix(meta, p + "attn_q.weight", q_rows, narrow=d),
            self._matrix(meta, p + "attn_k.weight", k_rows, narrow=d),
            self._matrix(meta, p + "attn_v.weight", narrow=d),
            self._matrix(meta, p + "attn_output.weight", narrow=d),
            self._matrix(meta, p + "ffn_gate.weight", narrow=d),
            self._matrix(meta, p + "ffn_up.weight", narrow=d),
            self._matrix(meta, p + "ffn_down.weight", narrow=d),
        ]

    def _arena_bytes(self, meta: GGUFFile) -> int:
        """Bytes of every matrix as it will be kept (a fused tensor's parts each in whole tiles)."""
        c = self.config

        def kept_type(info) -> int:
            narrow = self.drafting and info.name != "token_embd.weight" and _narrowed(info.type)
            return GGML_Q4_0 if narrow else info.type

        size = 0
        for info in meta.tensors.values():
            if len(info.shape) != 2:
                continue
            parts = c.row_parts(info.name, info.shape[0])
            size += sum(tensor_bytes(kept_type(info), n, info.shape[1]) + 5 * Arena.ALIGN for _, n in parts)
        if self.drafting and "output.weight" not in meta.tensors:  # a separate, narrower output layer
            e = meta.tensors["token_embd.weight"]
            size += tensor_bytes(GGML_Q4_0, e.shape[0], e.shape[1]) + 5 * Arena.ALIGN
        return size

    def _load_weights(self, meta: GGUFFile, alongside: Callable[[], object] | None = None) -> None:
        c = self.config
        self._arena = Arena(self._arena_bytes(meta)) if self.huge_pages else None
        # the matrices the file's formats give as they are: re-packed together once all are laid out (a draft
        # model's narrowed ones are re-packed, then re-quantized, one at a time)
        self._jobs: list | None = [] if not self.drafting else None
        llama = c.family.permuted_qk
        q_rows = _unpermute_rows(c.num_attention_heads * c.head_dim, c.num_attention_heads) if llama else None
        k_rows = _unpermute_rows(c.num_key_value_heads * c.head_dim, c.num_key_value_heads) if llama else None
        self.embed = self._matrix(meta, "token_embd.weight")
        if "output.weight" in meta.tensors:
            self.lm_head = self._matrix(meta, "output.weight", narrow=self.drafting)
        elif self.drafting and _narrowed(meta.tensors["token_embd.weight"].type):
            self.lm_head = self._matrix(meta, "token_embd.weight", narrow=True)
        else:
            self.lm_head = self.embed
        self.tied = self.lm_head is self.embed
        self.final_norm = self._vector(meta, "output_norm.weight")
        self.layers: list[list[QTensor]] = []
        self.attn_norms, self.mlp_norms, self.qkv_biases = [], [], []
        norms: dict[str, list[np.ndarray]] = {}
        for i in range(c.num_hidden_layers):
            p = f"blk.{i}."
            self.layers.append(self._layer_matrices(meta, i, q_rows, k_rows))
            self.attn_norms.append(self._vector(meta, p + "attn_norm.weight"))
            self.mlp_norms.append(self._vector(meta, p + "ffn_norm.weight"))
            for part in ("attn_q_norm", "attn_k_norm", "post_attention_norm", "post_ffw_norm"):
                if p + part + ".weight" in meta.tensors:
                    norms.setdefault(part, []).append(self._vector(meta, p + part + ".weight"))
            if p + "attn_q.bias" in meta.tensors:
                bias = np.concatenate(
                    [
                        self._vector(meta, p + "attn_q.bias", q_rows),
                        self._vector(meta, p + "attn_k.bias", k_rows),
                        self._vector(meta, p + "attn_v.bias"),
                    ]
                )
                self.qkv_biases.append(bias)
            else:
                self.qkv_biases.append(None)
        self._repack(alongside)
        self.intermediate = self.layers[0][4].shape[0]
        self._stack = DecoderStack(
            self.layers,
            self.attn_norms,
            self.mlp_norms,
            self.qkv_biases,
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim,
            c.rms_norm_eps,
            variant=self._variant(norms),
            attention=self.attention,
        )
        self._set_head(self.lm_head)
        self._lib = self._stack._lib
        self._x = np.empty((MAX_ROWS, self.hidden), dtype=np.float32)  # a decoding step's rows (forward)

    def _repack(self, alongside: Callable[[], object] | None) -> None:
        """Re-pack the matrices laid out so far in one native call, on another thread while ``alongside`` runs
        (its result in ``self.alongside``); the file's pages are handed back as they are done."""
        jobs, self._jobs = self._jobs or [], None
        self.alongside = None
        if alongside is None:
            repack_jobs(jobs, release=True)
            return
        failure: list[BaseException] = []

        def work() -> None:
            try:
                repack_jobs(jobs, release=True)
            except BaseException as err:  # re-raised on the loading thread
                failure.append(err)

        thread = threading.Thread(target=work, name="specwise-repack", daemon=True)
        thread.start()
        try:
            self.alongside = alongside()
        finally:
            thread.join()
        if failure:
            raise failure[0]

    def _variant(self, norms: dict[str, list[np.ndarray]]) -> LayerVariant | None:
        """What this family's layers do beyond Llama's (None: nothing)."""
        c = self.config
        windows = c.windows()
        if not norms and windows is None:
            return None
        scale = 0.0
        if c.family.gemma and c.num_hidden_layers == 62:  # Gemma 3 27B scales queries by hidden / heads (llama.cpp)
            scale = (c.hidden_size / c.num_attention_heads) ** -0.5
        return LayerVariant(
            q_norms=norms.get("attn_q_norm"),
            k_norms=norms.get("attn_k_norm"),
            post_attn_norms=norms.get("post_attention_norm"),
            post_mlp_norms=norms.get("post_ffw_norm"),
            windows=windows,
            attn_scale=scale,
            embed_scale=float(np.float32(c.hidden_size**0.5)) if c.family.gemma else 0.0,
            gelu=c.family.gemma,
        )

    def _inverse_frequencies(self, meta: GGUFFile, base: float, scaled: bool = True) -> np.ndarray:
        """The rotary inverse frequencies base^(-2i/d), divided by the file's llama3 factors (``rope_freqs``) and by
        a linear scaling factor (``scaled``: Gemma 3's windowed layers are not scaled)."""
        c = self.config
        inv = inverse_frequencies(self.head_dim, base)  # float32, then divided in float32 (as llama.cpp, transformers)
        if scaled and "rope_freqs.weight" in meta.tensors:
            factors = np.array(meta.floats("rope_freqs.weight"), dtype=np.float32).reshape(-1)
            if not np.isfinite(factors).all() or (factors <= 0).any():
                raise GGUFError(f"{self.path.name}: tensor rope_freqs.weight holds factors that are not positive")
            inv = inv / factors
        if scaled and c.rope_scaling == "linear":
            inv = inv / np.float32(c.rope_scaling_factor)
        return inv

    def read_output_rows(self, ids) -> QTensor:
        """Rows ``ids`` (distinct token ids) of the file's output layer (the embedding where the file ties them), in
        that order and in the file's own block format: a QTensor ``[len(ids), hidden]`` whose row j gives token
        ``ids[j]``'s logit, re-packed from the file's mapping."""
        meta = GGUFFile(self.path)
        name = "output.weight" if "output.weight" in meta.tensors else "token_embd.weight"
        info = meta.tensors[name]
        rows, n_in = info.shape
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if not ids.size or int(ids.min()) < 0 or int(ids.max()) >= rows or np.unique(ids).size != ids.size:
            raise ValueError(f"{self.path.name}: output rows must be distinct token ids in [0, {rows})")
        head = QTensor(info.type, None, ids.size, n_in, name=f"{name}[{ids.size} rows]")
        repack_jobs([(head, _read_rows(self.path, info.offset, info.nbytes // rows, ids), None)])
        return head

    def restrict_output(self, ids) -> None:
        """Keep only rows ``ids`` (distinct token ids) of the output layer, in that order: every pass's logits are
        then ``[rows, len(ids)]``, column j the logit of token ``ids[j]``, equal to the full layer's (a draft model's
        draft vocabulary, ``specwise.drafters.vocab``). The rows' blocks are re-packed from the file's mapping (and
        re-quantized as ``drafting`` re-quantizes the layer). Call before ``sequence()``."""
        head = self.read_output_rows(ids)
        if self.drafting and _narrowed(head.ggml_type):
            head = head.requantized_q4_0()
        self.lm_head, self.tied = head, False
        self._set_head(head)
        self.vocab_size = head.shape[0]

    def _set_head(self, head: QTensor) -> None:
        """The output layer as the native calls take it: a one-element QMat array, and the single-sequence pass's
        ``qmodel`` (embedding, final norm, output layer), filled once here rather than at every pass."""
        self._head_struct = (QMat * 1)(head.struct)
        self._model_struct, self._model_keep = model_struct(self.embed, self.final_norm, self.eps, self._head_struct)

    @property
    def weight_bytes(self) -> int:
        """Bytes of the re-packed weights (the output layer counted once when it is the embedding)."""
        total = sum(w.nbytes for layer in self.layers for w in layer) + self.embed.nbytes
        return total + (0 if self.tied else self.lm_head.nbytes)

    # ---- cache -------------------------------------------------------------------------------------------

    def _grow(self, capacity: int) -> None:
        shape = (self.config.num_hidden_layers, self.n_kv, capacity, self.head_dim)
        # uninitialised (its pages become resident only when written): rows are written before they are read
        k_cache = lazy_empty(shape, self.kv_dtype)  # small pages: see lazy_empty
        v_cache = lazy_empty(shape, self.kv_dtype)
        feats = lazy_empty((capacity, self.hidden), np.float32)
        tokens = np.zeros(capacity, dtype=np.int64)
        if self._capacity:
            k_cache[:, :, : self._length] = self.k_cache[:, :, : self._length]
            v_cache[:, :, : self._length] = self.v_cache[:, :, : self._length]
            feats[: self._length] = self._features[: self._length]
            tokens[: self._length] = self._tokens[: self._length]
        self.k_cache, self.v_cache, self._features, self._tokens = k_cache, v_cache, feats, tokens
        self._capacity = capacity
        self._valid = self._length  # what lay past the length is not copied

    def reserve(self, length: int) -> None:
        """Room for ``length`` positions (rounded up to a power of two, at most ``max_length``) in one growth: a long
        prompt read in slices would otherwise grow the cache at each doubling, copying all it holds into new pages
        (faulting them in at once: 1-3 s at 4-8k positions on Qwen2.5-Coder-1.5B, a pause for every stream of the
        batch). The pages stay unwritten, so not resident, until positions are written."""
        if length > self._capacity:
            self._grow(min(1 << max(int(length) - 1, 1).bit_length(), self.max_length))

    def _tables(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Rotary tables ``[>= n, head_dim]`` (rotate-half sign folded into sin), grown for every sequence; those of
        the windowed layers, where they have their own, in ``self._rotary["local"]``."""
        if "cos" not in self._rotary or self._rotary["cos"].shape[0] < n:
            size = min(max(n, 2 * self._rotary["cos"].shape[0] if self._rotary else n), self.max_length)
            self._rotary["cos"], self._rotary["sin"] = rotary_tables(self._inv_freq, size)
            if self._inv_freq_local is not None:
                self._rotary["local"] = rotary_tables(self._inv_freq_local, size)
        return self._rotary["cos"], self._rotary["sin"]

    def sequence(self) -> QuantizedModel:
        """Another sequence over the same weights, with its own empty cache (see ``forward_batch``)."""
        other = copy.copy(self)
        other._capacity = other._length = other._valid = 0
        other.keep_features = False
        other._grow(min(self._capacity, self.max_length))
        return other

    @property
    def length(self) -> int:
        return self._length

    def copy_prefix(self, source: Model, length: int) -> None:
        self._check_copy_prefix(source, getattr(source, "embed", None) is self.embed, length)
        if length > self._capacity:
            self._length = 0  # nothing of this sequence's to keep
            self._grow(min(max(length, source._capacity), self.max_length))
        self.k_cache[:, :, :length] = source.k_cache[:, :, :length]
        self.v_cache[:, :, :length] = source.v_cache[:, :, :length]
        if self.keep_features:
            self._features[:length] = source._features[:length]
        self._tokens[:length] = source._tokens[:length]
        self._length = self._valid = length

    def rollback(self, length: int) -> None:
        """Move the length back; the positions past it keep what they hold, and a pass that feeds the same tokens
        there again (with features kept) reuses them rather than running the layers again (``reusable``)."""
        self._check_rollback(length)
        self._length = length

    def discard_past_length(self) -> None:
        self._valid = self._length

    def set_keep_features(self, keep: bool) -> None:
        if bool(keep) != self.keep_features:
            self._valid = self._length  # positions past the length were fed without (or with) their features
        super().set_keep_features(keep)

    def reusable(self, tokens: np.ndarray) -> int:
        """How many leading ``tokens`` a pass from the current length would find already computed: the same tokens
        at the same positions after the same context, fed before a rollback with features kept (their keys, values
        and features are what the pass would write, a row's numbers not depending on the rows beside it)."""
        if not self.keep_features or self._valid <= self._length:
            return 0
        held = self._tokens[self._length : min(self._valid, self._length + tokens.size)]
        differ = np.flatnonzero(held != tokens[: held.size])
        return int(differ[0]) if differ.size else int(held.size)

    def features(self, start: int, end: int) -> np.ndarray:
        """Float32 ``[end - start, hidden]``: a view of this sequence's buffer (valid until those positions are
        written again; copy it to keep it)."""
        self._check_features(start, end)
        return self._features[start:end]

    # ---- forward -----------------------------------------------------------------------------------------

    def _reserve(self, tokens: TokenIds, num_logits: int | None) -> tuple[np.ndarray, int, int]:
        """Check a pass's tokens and logits kept, and make room in the cache for them: (the tokens as an int64
        array, start position, kept)."""
        ids = self._check_forward(tokens)
        k = ids.size
        keep = k if num_logits is None else num_logits
        if not 0 <= keep <= k:
            raise ValueError(f"num_logits must be in [0, {k}], got {keep}")
        start = self._length
        if start + k > self._capacity:
            self._grow(min(max(2 * self._capacity, start + k), self.max_length))
        return ids, start, keep

    def forward(self, tokens: TokenIds, num_logits: int | None = None) -> np.ndarray:
        ids = token_ids(tokens)
        k = ids.size
        if ids.ndim != 1 or not 1 <= k <= MAX_ROWS or self.reusable(ids):
            # a prefill (in slices of MAX_ROWS), or a pass that finds rows already computed
            return self.forward_batch([(self, ids)], [num_logits])[0]
        # a decoding step: one native call from the embedding to the logits (forward_batch's numbers)
        return self._decode(ids, num_logits, self._model_struct, self.vocab_size)

    def _decode(self, ids: np.ndarray, num_logits: int | None, struct, width: int) -> np.ndarray:
        """A pass of at most MAX_ROWS rows in one native call, ending in the output layer of ``struct`` (``width``
        rows): float32 logits ``[kept, width]`` of the last rows."""
        ids, start, keep = self._reserve(ids, num_logits)
        ids = np.ascontiguousarray(ids)
        k = ids.size
        cos, sin = self._tables(start + k)
        logits = np.empty((keep, width), dtype=np.float32)
        features, room = None, 0
        if self.keep_features:
            features = self._features.ctypes.data + 4 * start * self.hidden
            room = (self._capacity - start) * self.hidden
        threads = self.governor.threads(k)
        began = time.perf_counter()
        self._stack.forward_one(
            self._x, ids, (self.k_cache, self.v_cache), start, cos, sin, self.precision, struct, keep, features, room,
            logits, self._rotary.get("local"), threads,
        )  # fmt: skip
        self.governor.record(threads, k, time.perf_counter() - began)
        self._tokens[start : start + k] = ids
        self._length = self._valid = start + k
        return logits

    def output_rows(self, rows: QTensor) -> tuple:
        """What :meth:`forward_last` takes to compute logits over ``rows`` (a QTensor ``[n, hidden]``: some rows of
        the output layer) instead of the whole layer: the native pass's model struct and what it points into."""
        head = (QMat * 1)(rows.struct)
        struct, keep = model_struct(self.embed, self.final_norm, self.eps, head)
        return struct, (keep, head, rows)

    def forward_last(self, tokens: TokenIds, output: tuple) -> np.ndarray:
        """``forward(tokens, 1)`` over the output rows of ``output`` (:meth:`output_rows`): float32 logits ``[1, n]``,
        in one native call (a drafting pass; the cache, the features and the reuse as ``forward``)."""
        ids = token_ids(tokens)
        k = ids.size
        struct, (_, _, rows) = output
        if ids.ndim != 1 or not 1 <= k <= MAX_ROWS or self.reusable(ids):
            if not self.keep_features:  # (checked before anything is fed)
                raise RuntimeError("forward_last over more than one pass's rows needs the features kept")
            self.forward(ids, 0)
            at = self._length
            return q_gemm(rows, self._features[at - 1 : at], mode=self.precision)
        return self._decode(ids, 1, struct, rows.shape[0])

    def forward_batch(
        self, items: list[tuple[Model, TokenIds]], num_logits: list[int | None] | None = None
    ) -> list[np.ndarray]:
        """One pass over several sequences (this model and others from ``sequence()``): the decoder layers read
        each weight once for all rows, and the output layer once for all kept rows. A row's logits are those of
        the same row in a pass of its own."""
        keeps = list(num_logits) if num_logits is not None else [None] * len(items)
        if len(keeps) != len(items):
            raise ValueError(f"{len(items)} sequences need {len(items)} num_logits, got {len(keeps)}")
        if len({id(seq) for seq, _ in items}) != len(items):
            raise ValueError("a sequence appears twice in one batch: give its tokens together")
        ids, caches, positions, spans = [], [], [], []
        for (seq, tokens), keep in zip(items, keeps):
            if getattr(seq, "_stack", None) is not self._stack:
                raise ValueError("forward_batch takes sequences of this model (made by its sequence())")
            tokens, start, keep = seq._reserve(tokens, keep)
            k = tokens.size
            reused = seq.reusable(tokens)  # leading rows already in the cache, features kept: not run again
            ids.append(tokens[reused:])
            caches.extend([(seq.k_cache, seq.v_cache)] * (k - reused))
            positions.extend(range(start + reused, start + k))
            spans.append((seq, start, k, keep, reused, tokens))
        if not spans:
            return []
        threads = self.governor.threads(max(len(positions), 1))
        began = time.perf_counter()
        normed = self._run_rows(ids, caches, positions, spans, threads)
        kept, at = [], 0
        for seq, start, k, keep, reused, tokens in spans:
            run = k - reused
            seq._tokens[start + reused : start + k] = tokens[reused:]
            if run:
                seq._valid = start + k  # what lay past the rows just written is stale
            seq._length = start + k
            if seq.keep_features:
                seq._features[start + reused : start + k] = normed[at : at + run]
                at += run
                kept.append(seq._features[start + k - keep : start + k])  # reused rows' features with the new
            else:
                kept.append(normed[at : at + keep])  # (no rows reused: only the kept rows were normed)
                at += keep
        h = np.ascontiguousarray(kept[0]) if len(kept) == 1 else np.concatenate(kept)  # [kept rows, hidden]
        n = h.shape[0]
        logits = np.empty((n, self.vocab_size), dtype=np.float32)
        if n:
            self._lib.specwise_q_gemm(
                self._head_struct,
                1,
                h.ctypes.data,
                None,
                logits.ctypes.data,
                n,
                _mode_id(self.precision),
                threads,
            )
        self.governor.record(threads, max(len(positions), 1), time.perf_counter() - began)
        out, row = [], 0
        for _, _, _, keep, _, _ in spans:
            out.append(logits[row : row + keep])
            row += keep
        return out

    def _run_rows(self, ids: list, caches: list, positions: list[int], spans: list, threads: int) -> np.ndarray:
        """The decoder layers over the rows not reused, then the final norm over the rows that need it: every row of
        a sequence keeping its features, else the rows whose logits are kept. Returns the normed rows ``[need,
        hidden]`` in the order of ``spans``."""
        if not positions:
            return np.empty((0, self.hidden), dtype=np.float32)
        x = self.embed.rows(np.concatenate(ids))  # [rows, hidden]
        variant = self._stack.variant
        if variant is not None and variant.embed_scale:
            x *= variant.embed_scale  # float32, as the single-sequence pass scales its rows
        cos, sin = self._tables(max(positions) + 1)
        self._stack.run(x, caches, positions, cos, sin, self.precision, threads, local=self._rotary.get("local"))
        need: list[int] = []
        row = 0
        for seq, _, k, keep, reused, _ in spans:
            run = k - reused
            need.extend(range(row if seq.keep_features else row + run - min(keep, run), row + run))
            row += run
        rows = x if len(need) == x.shape[0] else x[need]  # [need, hidden], C-contiguous
        normed = np.empty_like(rows)  # the layers' own norm, as the single-sequence pass computes it
        self._lib.specwise_rms_norm_rows(
            rows.ctypes.data, self.final_norm.ctypes.data, normed.ctypes.data, len(need), self.hidden, self.eps
        )
        return normed

    def __repr__(self) -> str:
        return (
            f"QuantizedModel({self.name}, {self.config.architecture}, precision={self.precision}, "
            f"{self.weight_bytes / 1e6:.1f} MB of weights)"
        )


def _read_rows(path, offset: int, row_bytes: int, ids: np.ndarray) -> np.ndarray:
    """Rows ``ids`` of a row-major tensor at ``offset`` of the file, read with ``pread`` into one array ``[n,
    row_bytes]``. Rows scattered over a large tensor, read through the file's mapping, would bring most of its pages
    into the process's resident memory for a moment (the kernel maps pages around each one touched): 150 MB of
    Gemma 3's output layer for 16,384 of its rows."""
    out = np.empty((ids.size, row_bytes), dtype=np.uint8)
    with open(path, "rb", buffering=0) as f:
        fd = f.fileno()
        for j, row in enumerate(ids.tolist()):
            data = os.pread(fd, row_bytes, offset + row * row_bytes)
            if len(data) != row_bytes:
                raise GGUFError(f"{Path(path).name}: the file ends inside row {row} of its output layer")
            out[j] = np.frombuffer(data, dtype=np.uint8)
    return out

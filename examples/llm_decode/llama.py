"""The Llama-style decoder of examples/llm_decode in PyTorch: the same model as
the C++ one (model.hpp), with the same weights files and the same static KV
cache, so that the Python peers of bench/llm_decode/ time the same work and
scripts/llm_decode_compare.py can check the C++ logits against it.

The math is Hugging Face's LlamaForCausalLM (eager attention) exactly:
rmsnorm in float32 then cast back, rotary embeddings in the rotate_half form
with cos/sin computed in float32 and cast to the model dtype, grouped-query
attention with the scores scaled after q k^T, the softmax in float32 then cast
back, SiLU-gated MLP, tied or untied lm_head. `to_hf` builds that HF model
with the same weights, which is how the tests prove the two agree.

A weights directory holds
  config.json  Hugging Face LlamaConfig key names: vocab_size, hidden_size,
               intermediate_size, num_hidden_layers, num_attention_heads,
               num_key_value_heads, max_position_embeddings (the cache's
               max_len), rope_theta, rms_norm_eps, tie_word_embeddings,
               torch_dtype
  weights.pt   a dict of CPU tensors with HF names (torch.save here,
               torch::pickle_save in C++; torch.load reads both)

    model = load(dir, "cuda", torch.float16)
    cache = KvCache(model.config, slots=8, device="cuda", dtype=torch.float16)
    logits = model.prefill(cache, 0, prompt)                      # float32 [vocab]
    logits = model.decode(cache, slots, positions, tokens, 128)   # dtype [B, vocab]

Needs only torch; `to_hf` also needs transformers.
"""
import dataclasses
import json
import pathlib

import torch

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "weights.pt"

_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}

# The C++ presets (LlamaConfig::preset). "tiny" is for tests.
PRESETS = {
    "tiny": dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                 tie_word_embeddings=True),
    "small": dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                  num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=1024,
                  tie_word_embeddings=True),
    "1b": dict(vocab_size=32000, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
               num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=1024,
               tie_word_embeddings=False),
}


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """config.json, field for field (Hugging Face's key names)."""
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = True
    torch_dtype: str = "float16"

    def __post_init__(self):
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of "
                             f"num_attention_heads {self.num_attention_heads}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                             f"num_key_value_heads {self.num_key_value_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} is odd; rotary embeddings need it even")
        if self.torch_dtype not in _DTYPES:
            raise ValueError(f"torch_dtype {self.torch_dtype!r}: one of {', '.join(_DTYPES)}")

    @property
    def head_dim(self):
        return self.hidden_size // self.num_attention_heads

    @property
    def max_len(self):
        return self.max_position_embeddings

    @staticmethod
    def preset(name, **overrides):
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}: one of {', '.join(PRESETS)}")
        return LlamaConfig(**{**PRESETS[name], **overrides})

    @staticmethod
    def from_dict(values):
        fields = {f.name for f in dataclasses.fields(LlamaConfig)}
        known = {k: v for k, v in values.items() if k in fields}
        if "torch_dtype" not in known and isinstance(values.get("dtype"), str):
            known["torch_dtype"] = values["dtype"]  # transformers 5 writes "dtype"
        if "head_dim" in values and values["head_dim"] != values["hidden_size"] // values["num_attention_heads"]:
            raise ValueError(f"head_dim {values['head_dim']} != hidden_size / num_attention_heads")
        return LlamaConfig(**known)

    def to_dict(self):
        return dataclasses.asdict(self)


def read_config(path):
    with open(path) as f:
        return LlamaConfig.from_dict(json.load(f))


def write_config(config, path):
    with open(path, "w") as f:
        json.dump(config.to_dict(), f, indent=2)
        f.write("\n")


def dtype_of(name):
    return _DTYPES[name]


def weight_shapes(config):
    """Every tensor of weights.pt by its Hugging Face name, in this order."""
    h, hd = config.hidden_size, config.head_dim
    shapes = {"model.embed_tokens.weight": (config.vocab_size, h)}
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes[p + "self_attn.q_proj.weight"] = (config.num_attention_heads * hd, h)
        shapes[p + "self_attn.k_proj.weight"] = (config.num_key_value_heads * hd, h)
        shapes[p + "self_attn.v_proj.weight"] = (config.num_key_value_heads * hd, h)
        shapes[p + "self_attn.o_proj.weight"] = (h, config.num_attention_heads * hd)
        shapes[p + "mlp.gate_proj.weight"] = (config.intermediate_size, h)
        shapes[p + "mlp.up_proj.weight"] = (config.intermediate_size, h)
        shapes[p + "mlp.down_proj.weight"] = (h, config.intermediate_size)
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
    shapes["model.norm.weight"] = (h,)
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, h)
    return shapes


def random_weights(config, seed):
    """Matrices normal(0, 0.02), norms 1, drawn in float32 from a seeded CPU
    generator in weight_shapes' order. For local tests: the benchmark's
    weights are written by the C++ side, whose draws need not match these."""
    generator = torch.Generator().manual_seed(seed)
    weights = {}
    for name, shape in weight_shapes(config).items():
        if len(shape) == 1:
            weights[name] = torch.ones(shape)
        else:
            weights[name] = torch.empty(shape).normal_(0.0, 0.02, generator=generator)
    return weights


def write_random(directory, preset_or_config, seed=0, dtype=None):
    """config.json and weights.pt of a random model in `directory` (made if
    missing). `dtype` (a name or torch dtype) overrides the config's."""
    config = preset_or_config if isinstance(preset_or_config, LlamaConfig) else LlamaConfig.preset(preset_or_config)
    if dtype is not None:
        name = dtype if isinstance(dtype, str) else next(k for k, v in _DTYPES.items() if v == dtype)
        config = dataclasses.replace(config, torch_dtype=name)
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    weights = {k: v.to(dtype_of(config.torch_dtype)) for k, v in random_weights(config, seed).items()}
    write_config(config, directory / CONFIG_FILE)
    torch.save(weights, directory / WEIGHTS_FILE)
    return config


def read_weights(directory, config):
    """weights.pt as a dict, checked against the config (names and shapes)."""
    # torch::pickle_save tags the dict with its type (Dict[str, Tensor]) through
    # torch.jit._pickle.restore_type_tag, which weights_only loading refuses
    # unless allowed; it only sets that tag.
    import torch.jit._pickle
    with torch.serialization.safe_globals([torch.jit._pickle.restore_type_tag]):
        weights = torch.load(pathlib.Path(directory) / WEIGHTS_FILE, map_location="cpu", weights_only=True)
    if not isinstance(weights, dict):
        raise ValueError(f"{WEIGHTS_FILE}: expected a dict of tensors, got {type(weights).__name__}")
    expected = weight_shapes(config)
    if config.tie_word_embeddings and "lm_head.weight" in weights:
        # A tied lm_head written out anyway (as HF's save_pretrained may): it
        # must be the embedding itself.
        if not torch.equal(weights["lm_head.weight"], weights.get("model.embed_tokens.weight")):
            raise ValueError(f"{WEIGHTS_FILE}: tie_word_embeddings, but lm_head.weight differs from "
                             "model.embed_tokens.weight")
        weights = {k: v for k, v in weights.items() if k != "lm_head.weight"}
    missing = [k for k in expected if k not in weights]
    unexpected = [k for k in weights if k not in expected]
    if missing or unexpected:
        raise ValueError(f"{WEIGHTS_FILE}: missing {missing[:4]}{'...' if len(missing) > 4 else ''}, "
                         f"unexpected {unexpected[:4]}{'...' if len(unexpected) > 4 else ''}")
    for name, shape in expected.items():
        if tuple(weights[name].shape) != shape:
            raise ValueError(f"{WEIGHTS_FILE}: {name} has shape {tuple(weights[name].shape)}, expected {shape}")
    return weights


def rmsnorm(x, weight, eps):
    """HF's LlamaRMSNorm (statistics in float32) through torch's rms_norm, one
    fused kernel on CUDA, as model.hpp does: the weight is applied before the
    rounding to x's dtype (HF rounds first), at most one unit in the last place
    apart."""
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class KvCache:
    """Keys and values of every layer, [layers, slots + 1, kv_heads, max_len,
    head_dim] each. Slot `spare_slot` (the last) takes the writes of padding
    and finished rows; nothing reads it for real output."""

    def __init__(self, config, slots, device, dtype=torch.float16):
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        shape = (config.num_hidden_layers, slots + 1, config.num_key_value_heads, config.max_len, config.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.slots = slots

    @property
    def spare_slot(self):
        return self.slots


class _Layer(torch.nn.Module):
    def __init__(self, weights, prefix):
        super().__init__()
        for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                     "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm",
                     "post_attention_layernorm"):
            self.register_buffer(name.split(".")[-1], weights[f"{prefix}{name}.weight"])
        # One matrix for q/k/v and one for gate/up, as model.hpp (two matrix
        # products per layer fewer); not saved (save() writes the parts).
        self.register_buffer("qkv", torch.cat((self.q_proj, self.k_proj, self.v_proj)), persistent=False)
        self.register_buffer("gate_up", torch.cat((self.gate_proj, self.up_proj)), persistent=False)


class LlamaModel(torch.nn.Module):
    """The weights as buffers of a Module (so that torch.compile treats them as
    static inputs), and prefill / decode / forward_full as in model.hpp."""

    def __init__(self, config, weights, device, dtype=torch.float16):
        super().__init__()
        self.config = config
        self.device = torch.device(device)
        self.dtype = dtype
        on = {k: v.to(device=self.device, dtype=dtype) for k, v in weights.items()}
        self.register_buffer("embed_tokens", on["model.embed_tokens.weight"])
        self.layers = torch.nn.ModuleList(_Layer(on, f"model.layers.{i}.") for i in range(config.num_hidden_layers))
        self.register_buffer("norm", on["model.norm.weight"])
        self.register_buffer("lm_head", self.embed_tokens if config.tie_word_embeddings else on["lm_head.weight"])
        # Rotary tables, HF's way: inv_freq in float32 on the CPU, angles and
        # cos/sin in float32 on the device, cast to the model dtype; a row per position.
        hd = config.head_dim
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        positions = torch.arange(config.max_len, dtype=torch.float32, device=self.device)
        freqs = positions[:, None] * inv_freq.to(self.device)[None, :]
        angles = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("rope_cos", angles.cos().to(dtype))
        self.register_buffer("rope_sin", angles.sin().to(dtype))
        self.register_buffer("position_range", torch.arange(config.max_len, device=self.device))
        self.register_buffer("kv_head_range", torch.arange(config.num_key_value_heads, device=self.device))
        self.register_buffer("layer_range", torch.arange(config.num_hidden_layers, device=self.device))
        self.scaling = hd ** -0.5

    @staticmethod
    def random(config, seed, device, dtype=torch.float16):
        return LlamaModel(config, random_weights(config, seed), device, dtype)

    def save(self, directory):
        directory = pathlib.Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        names = {"embed_tokens": "model.embed_tokens.weight", "norm": "model.norm.weight"}
        weights = {}
        for name, tensor in self.named_buffers():
            if name in names:
                weights[names[name]] = tensor
            elif name.startswith("layers."):
                _, i, leaf = name.split(".")
                if leaf in ("qkv", "gate_up"):
                    continue  # the fused copies
                sub = "mlp." if leaf.endswith(("gate_proj", "up_proj", "down_proj")) else (
                    "self_attn." if leaf.endswith("_proj") else "")
                weights[f"model.layers.{i}.{sub}{leaf}.weight"] = tensor
        if not self.config.tie_word_embeddings:
            weights["lm_head.weight"] = self.lm_head
        dtype_name = next(k for k, v in _DTYPES.items() if v == self.dtype)
        write_config(dataclasses.replace(self.config, torch_dtype=dtype_name), directory / CONFIG_FILE)
        torch.save({k: v.detach().cpu().clone() for k, v in weights.items()}, directory / WEIGHTS_FILE)

    # -- pieces shared by the prompt and decode paths -------------------------

    def _qkv(self, layer, x, cos, sin):
        """x [N, hidden] -> q [N, heads, hd], k and v [N, kv_heads, hd], q and k rotated."""
        c = self.config
        h = rmsnorm(x, layer.input_layernorm, c.rms_norm_eps)
        n = x.shape[0]
        heads, kv = c.num_attention_heads, c.num_key_value_heads
        qkv = torch.nn.functional.linear(h, layer.qkv).view(n, heads + 2 * kv, c.head_dim)
        qk = qkv[:, :heads + kv]
        cos, sin = cos[:, None, :], sin[:, None, :]
        qk = qk * cos + rotate_half(qk) * sin  # q and k rotated together
        return qk[:, :heads], qk[:, heads:], qkv[:, heads + kv:]

    def _attend(self, q, k, v, masked):
        """q [..., M, hd] against k and v [..., S, hd] (batch dimensions
        broadcast), masked broadcastable to [..., M, S] (True: not attended)
        -> [..., M, hd]."""
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.scaling
        scores = scores.masked_fill(masked, float("-inf"))
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(weights, v)

    def _mlp_residual(self, layer, x):
        h = rmsnorm(x, layer.post_attention_layernorm, self.config.rms_norm_eps)
        f = torch.nn.functional
        gate_up = f.linear(h, layer.gate_up)
        i = self.config.intermediate_size
        return x + f.linear(f.silu(gate_up[:, :i]) * gate_up[:, i:], layer.down_proj)

    def _logits(self, x):
        return torch.nn.functional.linear(rmsnorm(x, self.norm, self.config.rms_norm_eps), self.lm_head)

    def _prompt_hidden(self, tokens, cache=None, slot=None):
        """The hidden states [T, hidden] of positions 0..T-1 with full causal
        attention; with a cache, also writes the prompt's keys and values into `slot`."""
        c = self.config
        t = tokens.shape[0]
        if not 1 <= t <= c.max_len:
            raise ValueError(f"prompt of {t} tokens: 1 to max_len {c.max_len} allowed")
        kv, group = c.num_key_value_heads, c.num_attention_heads // c.num_key_value_heads
        cos, sin = self.rope_cos[:t], self.rope_sin[:t]
        causal = torch.ones(t, t, dtype=torch.bool, device=self.device).triu(1)
        x = torch.nn.functional.embedding(tokens, self.embed_tokens)
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, x, cos, sin)
            k, v = k.transpose(0, 1), v.transpose(0, 1)  # [kv, T, hd]
            if cache is not None:
                cache.k[i, slot, :, :t] = k
                cache.v[i, slot, :, :t] = v
            q = q.transpose(0, 1).reshape(kv, group, t, c.head_dim)
            out = self._attend(q, k[:, None], v[:, None], causal)  # [kv, group, T, hd]
            out = out.reshape(c.num_attention_heads, t, c.head_dim).transpose(0, 1).reshape(t, c.hidden_size)
            x = x + torch.nn.functional.linear(out, layer.o_proj)
            x = self._mlp_residual(layer, x)
        return x

    # -- the interface of model.hpp -------------------------------------------

    def prefill(self, cache, slot, tokens):
        """Writes the keys/values of `tokens` (int64 [T]) into `slot` at
        positions 0..T-1; the logits of the last position, float32 [vocab]."""
        if not 0 <= slot < cache.slots:
            raise ValueError(f"slot {slot}: 0 to {cache.slots - 1} allowed (slot {cache.spare_slot} is the spare)")
        x = self._prompt_hidden(tokens, cache, slot)
        return self._logits(x[-1:])[0].float()

    def decode(self, cache, slots, positions, tokens, context):
        """One step for B rows, capture-safe (no host sync, no host tensors):
        writes the keys/values of tokens[r] at (slots[r], positions[r]) and
        attends to positions 0..positions[r] of that slot, reading the cache
        up to `context` positions (every positions[r] < context <= max_len).
        slots, positions, tokens: int64 [B] on the device. Logits [B, vocab]
        in the model dtype."""
        c = self.config
        b = tokens.shape[0]
        kv, group, hd = c.num_key_value_heads, c.num_attention_heads // c.num_key_value_heads, c.head_dim
        cos, sin = self.rope_cos.index_select(0, positions), self.rope_sin.index_select(0, positions)
        # Row r, kv head j of layer i goes to cache[i, slots[r], j, positions[r]]:
        # one index_put_ on the whole cache tensor, not on a view of it, so
        # that torch.compile updates the cache in place (through a view, its
        # functionalization writes the whole cache back every step).
        slot_index, head_index, position_index = slots[:, None], self.kv_head_range[None, :], positions[:, None]
        visible = (self.position_range[:context][None, :] <= positions[:, None])[:, None, None, :]  # [B, 1, 1, ctx]
        x = torch.nn.functional.embedding(tokens, self.embed_tokens)
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, x, cos, sin)
            index = (self.layer_range[i:i + 1], slot_index, head_index, position_index)
            cache.k.index_put_(index, k)
            cache.v.index_put_(index, v)
            layer_k, layer_v = cache.k[i], cache.v[i]
            keys = layer_k.narrow(2, 0, context).index_select(0, slots)  # [B, kv, ctx, hd]
            values = layer_v.narrow(2, 0, context).index_select(0, slots)
            # The group of query heads sharing a kv head are the query rows of
            # one fused attention over that head's keys, as model.hpp.
            out = torch.nn.functional.scaled_dot_product_attention(
                q.reshape(b, kv, group, hd), keys, values, attn_mask=visible, scale=self.scaling)  # [B, kv, group, hd]
            x = x + torch.nn.functional.linear(out.reshape(b, c.hidden_size), layer.o_proj)
            x = self._mlp_residual(layer, x)
        return self._logits(x)

    def forward_full(self, tokens):
        """No cache: the logits of every position of `tokens` [T] with full
        causal attention, float32 [T, vocab] (the reference of the tests)."""
        return self._logits(self._prompt_hidden(tokens)).float()


def load(directory, device="cuda", dtype=None):
    """The model of a weights directory (config.json + weights.pt); `dtype`
    defaults to the config's torch_dtype."""
    directory = pathlib.Path(directory)
    config = read_config(directory / CONFIG_FILE)
    if dtype is None:
        dtype = dtype_of(config.torch_dtype)
    return LlamaModel(config, read_weights(directory, config), device, dtype)


def hf_config(config, attn_implementation="eager"):
    """transformers.LlamaConfig of the same model. No bos/eos/pad tokens: with
    no eos, generate always makes max_new_tokens tokens."""
    from transformers import LlamaConfig as HfLlamaConfig
    values = config.to_dict()
    values.pop("torch_dtype")
    hf = HfLlamaConfig(**values, hidden_act="silu", attention_bias=False, mlp_bias=False,
                       head_dim=config.head_dim, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                       dtype=config.torch_dtype)
    hf._attn_implementation = attn_implementation
    return hf


def to_hf(directory, device="cuda", dtype=None, attn_implementation="eager"):
    """transformers' LlamaForCausalLM with the weights of `directory`, in
    eval mode. "eager" attention is our math step for step (the tests and
    scripts/llm_decode_compare.py use it); "sdpa", the transformers default,
    is what users run (the benchmark's Hugging Face peers use it)."""
    from transformers import LlamaForCausalLM
    directory = pathlib.Path(directory)
    config = read_config(directory / CONFIG_FILE)
    if dtype is None:
        dtype = dtype_of(config.torch_dtype)
    weights = read_weights(directory, config)
    # Built as from_pretrained builds it: under the target dtype as the
    # default one, so the rotary inv_freq buffer stays float32 (a later
    # .to(dtype) would round it).
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(hf_config(config, attn_implementation))
    finally:
        torch.set_default_dtype(previous)
    result = model.load_state_dict({k: v.to(dtype) for k, v in weights.items()}, strict=False)
    missing = [k for k in result.missing_keys if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or result.unexpected_keys:
        raise ValueError(f"to_hf: missing {missing}, unexpected {result.unexpected_keys}")
    if config.tie_word_embeddings and model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
        raise ValueError("to_hf: lm_head is not tied to embed_tokens")
    return model.eval()
